//! The broker's data path: streams, shards, publishing and subscriptions, keeping the
//! promises of the delivery-semantics spec on one node.
//!
//! * Existence: every operation is checked against the local registry (the control
//!   plane's watch), so an unknown tenant, namespace, stream or shard is refused with a typed
//!   error and the data path never waits on Raft.
//! * Durable shards are a [`ShardLog`] each. A publish is acknowledged after the write under
//!   the fsync policy (`ack_on_commit`, the default) or on enqueue (`FELIX_ACK_ON_COMMIT=0`).
//! * Fanout of a durable shard follows the log: one task per shard reads what was committed,
//!   in offset order, and offers it to every live subscriber's bounded queue. A subscriber
//!   whose queue is full loses that event — only it; on a durable stream its subscription
//!   then ends with `subscription_lagged` and the offset to resume from. Publishers never
//!   wait for subscribers.
//! * A subscription that starts in the past replays history straight from the log (never
//!   dropped: QUIC flow control slows the replay instead) and joins live delivery at the
//!   fanout's cursor, under the fanout's lock, so nothing is skipped or repeated.
//! * Ephemeral shards keep nothing: a publish is offered to the live subscribers and
//!   acknowledged when queued; their drops are counted, not announced. In a cluster each
//!   has one leader, as a durable shard does (see [`crate::ephemeral`]).
//! * Publisher backpressure: each tenant has its own `pub_queue_depth` publish slots, so a
//!   flooding tenant exhausts only its own; see [`TenantQueues`].
//! * Tiering: each durable shard's log sits behind a [`TieredShard`], so history reads below
//!   the local log come from the object store. Two tasks per durable shard upload sealed
//!   segments (when the stream is tiered) and apply retention to both tiers.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use felix_cold::cache::{ColdCache, ObjectRef};
use felix_cold::store::TierStore;
use felix_cold::tiered::{Manifest, ManifestState, Tier, TieredShard, upload_backlog};
use felix_cold::uploader::{TierObserver, Uploader, UploaderConfig};
use felix_cold::{ColdError, retention};
use felix_hot::{LogConfig, LogError, ShardLog};
use felix_meta::model::{
    Command, CommandError, Consistency, Durability, ShardKey, StreamSettings, StreamSettingsPatch,
};
use felix_meta::state_machine::Registry;
use felix_meta::{Applied, MetaError, MetaHandle};
use felix_wire::protocol::{
    AckMode, BrokerRoute, ErrorBody, SegmentInfo, ShardInfo, ShardRoute, StartAt, StreamConfig,
    StreamInfo, codes,
};
use felix_wire::{BatchHeader, BatchIter};
use parking_lot::Mutex;
use tokio::sync::{Semaphore, mpsc, watch};
use tracing::{info, warn};

use crate::config::BrokerConfig;
use crate::corruption;
use crate::metrics::{Metrics, TenantAction, TenantReason};
use crate::producers::{ProducerTable, SeqCheck};
use crate::replication::{Lease, ReplState, Role};

fn err(code: u16, reason: &str, message: impl Into<String>) -> ErrorBody {
    ErrorBody::new(code, reason, message)
}

/// Maps a control-plane refusal to a protocol error.
pub fn command_error(e: &CommandError) -> ErrorBody {
    match e {
        CommandError::AlreadyExists { .. } => {
            err(codes::ALREADY_EXISTS, "already_exists", e.to_string())
        }
        CommandError::NotFound { kind, .. } => match kind.as_str() {
            "tenant" => err(codes::UNKNOWN_TENANT, "unknown_tenant", e.to_string()),
            "namespace" => err(codes::UNKNOWN_NAMESPACE, "unknown_namespace", e.to_string()),
            "stream" => err(codes::UNKNOWN_STREAM, "unknown_stream", e.to_string()),
            "shard" => err(codes::UNKNOWN_SHARD, "unknown_shard", e.to_string()),
            _ => err(codes::INVALID_ARGUMENT, "not_found", e.to_string()),
        },
        CommandError::VersionConflict { .. } => {
            err(codes::VERSION_CONFLICT, "version_conflict", e.to_string())
        }
        CommandError::NotEmpty { .. } => err(codes::NOT_EMPTY, "not_empty", e.to_string()),
        CommandError::Invalid(_) => err(codes::INVALID_ARGUMENT, "invalid_argument", e.to_string()),
        CommandError::StaleGeneration { .. } => {
            err(codes::SHARD_UNAVAILABLE, "fenced", e.to_string()).retry_after(200)
        }
        // The name frees itself once the old objects are gone (object_deletes.rs).
        CommandError::BeingDeleted { .. } => {
            err(codes::ALREADY_EXISTS, "stream_being_deleted", e.to_string()).retry_after(1000)
        }
    }
}

fn meta_error(e: MetaError) -> ErrorBody {
    match e {
        MetaError::Rejected(c) => command_error(&c),
        other => err(
            codes::METADATA_UNAVAILABLE,
            "metadata_unavailable",
            other.to_string(),
        )
        .retry_after(500),
    }
}

fn cold_error(e: &ColdError) -> ErrorBody {
    match e {
        ColdError::TooOld {
            requested,
            earliest,
        } => {
            let mut body = err(
                codes::OFFSET_TOO_OLD,
                "offset_too_old",
                format!(
                    "offset {requested} was removed by retention; the earliest offset is {earliest}"
                ),
            );
            body.earliest_offset = Some(*earliest);
            body
        }
        ColdError::Log(e) => log_error(e),
        ColdError::Segment { key, source } => corruption::detected(
            corruption::Tier::Cold,
            key,
            &format!("object {key}: {source}"),
        ),
        ColdError::Store(_) | ColdError::Fetch { .. } => err(
            codes::SHARD_UNAVAILABLE,
            "cold_tier_unavailable",
            format!("the object store holding this history cannot be read: {e}"),
        )
        .retry_after(1000),
        other => err(codes::INTERNAL, "cold_tier_error", other.to_string()),
    }
}

pub(crate) fn log_error(e: &LogError) -> ErrorBody {
    match e {
        LogError::InvalidBatch(w) => err(codes::BAD_REQUEST, "invalid_batch", w.to_string()),
        LogError::TrailingBytes { .. } => err(codes::BAD_REQUEST, "invalid_batch", e.to_string()),
        LogError::BatchTooLarge { .. } | LogError::DecompressesTooLarge { .. } => {
            err(codes::RECORD_TOO_LARGE, "record_too_large", e.to_string())
        }
        LogError::OffsetOutOfRange { .. } => err(
            codes::OFFSET_OUT_OF_RANGE,
            "offset_out_of_range",
            e.to_string(),
        ),
        LogError::Corrupt { segment, .. } => corruption::detected(
            corruption::Tier::Hot,
            &segment.display().to_string(),
            &e.to_string(),
        ),
        LogError::WriteRefused { .. } => err(
            codes::SHARD_UNAVAILABLE,
            "fenced",
            format!("{e}: this broker's lease lapsed before the write, so nothing was written"),
        )
        .retry_after(500),
        _ => err(codes::SHARD_UNAVAILABLE, "shard_unavailable", e.to_string()).retry_after(1000),
    }
}

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
struct SubQueue {
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
fn sub_queue(
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
struct Fanout {
    inner: Mutex<FanoutInner>,
}

#[derive(Default)]
struct FanoutInner {
    cursor: u64,
    subscribers: Vec<SubQueue>,
}

impl Fanout {
    /// Offers a batch to every subscriber; a full queue drops it for that subscriber only.
    fn offer(&self, batch: LiveBatch, metrics: &Metrics) {
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

    fn remove(&self, id: u64) {
        self.inner.lock().subscribers.retain(|q| q.id != id);
    }
}

/// One shard on this broker.
pub struct Shard {
    pub key: ShardKey,
    /// `None` for an ephemeral shard.
    pub(crate) log: Option<ShardLog>,
    /// Role, read bound and followers' progress (durable shards of a cluster).
    pub(crate) repl: Option<Arc<ReplState>>,
    fanout: Arc<Fanout>,
    /// Ephemeral shards number batches themselves.
    pub(crate) ephemeral_next: AtomicU64,
    closed: Arc<AtomicBool>,
    /// Idempotent producers' sequences (in memory only on an ephemeral shard). Held across
    /// the check and the enqueue of a publish, so two re-sends of one batch cannot both be
    /// appended.
    pub(crate) producers: tokio::sync::Mutex<ProducerTable>,
    /// Both tiers behind one read path (durable shards).
    pub(crate) tier: Option<Arc<TieredShard>>,
    /// Stops the shard's upload and retention tasks when set or dropped.
    stop_tasks: watch::Sender<bool>,
    /// Asks the retention task for a pass now.
    retention_now: Arc<tokio::sync::Notify>,
    /// Which stream of its name this shard is of ([`felix_meta::model::Stream::incarnation`]).
    incarnation: u64,
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
        self.fanout.inner.lock().subscribers.clear();
    }

    /// Restarts live delivery at `offset` (after the log was cut there).
    pub(crate) fn reset_fanout(&self, offset: u64) {
        let mut inner = self.fanout.inner.lock();
        inner.subscribers.clear();
        inner.cursor = offset;
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
            (Some(r), _) => *r.visible.borrow(),
            (None, Some(log)) => log.committed_offset(),
        }
    }

    /// Changes whenever [`Shard::visible_end`] may have moved.
    pub(crate) fn watch_visible(&self) -> Option<watch::Receiver<u64>> {
        match (&self.repl, &self.log) {
            (_, None) => None,
            (Some(r), _) => Some(r.visible.subscribe()),
            (None, Some(log)) => Some(log.watch_committed()),
        }
    }
}

/// Per-tenant publish slots: each tenant gets `depth` of its own, so one tenant's flood
/// queues behind its own slots and never behind another tenant's.
pub struct TenantQueues {
    depth: usize,
    tenants: Mutex<HashMap<String, Arc<Semaphore>>>,
}

impl TenantQueues {
    fn new(depth: usize) -> TenantQueues {
        TenantQueues {
            depth: depth.max(1),
            tenants: Mutex::new(HashMap::new()),
        }
    }
    fn of(&self, tenant: &str) -> Arc<Semaphore> {
        self.tenants
            .lock()
            .entry(tenant.to_owned())
            .or_insert_with(|| Arc::new(Semaphore::new(self.depth)))
            .clone()
    }
}

/// A subscription as the server drives it.
pub struct Subscription {
    pub start_offset: u64,
    pub live_offset: u64,
    state: SubState,
    /// Most bytes one history read takes: the subscription's share of its connection's
    /// `subscriber_egress_max_bytes` (see [`Subscription::set_egress_share`]).
    read_limit: usize,
}

/// Largest history read, and the default share.
const MAX_HISTORY_READ: usize = 256 << 10;

enum SubState {
    /// Durable: replaying history from `pos`, then live through `queue`.
    Durable {
        shard: Arc<Shard>,
        pos: u64,
        queue: Option<SubReceiver>,
        id: u64,
        tenant: String,
        capacity: usize,
        max_bytes: usize,
        /// Drops end the subscription with `subscription_lagged` (the client offered the
        /// feature); otherwise they show as offset jumps and it carries on.
        announce_drops: bool,
    },
    /// Ephemeral: live only.
    Ephemeral {
        shard: Arc<Shard>,
        queue: SubReceiver,
        id: u64,
    },
}

/// What `Subscription::next` yields.
pub enum SubEvent {
    Batches(LiveBatch),
    /// History cannot be read (e.g. the object store is unreachable): the subscription
    /// ends with this error.
    Failed(ErrorBody),
    Lagged {
        resume_offset: u64,
    },
    /// The shard was closed (stream deleted or broker stopping).
    Closed,
}

impl Subscription {
    /// Bounds what this subscription holds outside its queue to `bytes`: the broker takes
    /// at most one frame at a time from a subscription, so a history read no larger than the
    /// share keeps the connection's egress within `subscriber_egress_max_bytes`. (A live
    /// batch larger than the share is still sent whole: batches are never split.)
    pub fn set_egress_share(&mut self, bytes: usize) {
        self.read_limit = bytes.clamp(4096, MAX_HISTORY_READ);
    }

    /// For a client that did not offer `FEATURE_SUBSCRIPTION_LAGGED`: a durable
    /// subscription's drops are counted and skipped, as an ephemeral one's are, and the
    /// subscription carries on (the records' offsets show the jump). Call before the first
    /// [`Subscription::next`].
    pub fn keep_through_drops(&mut self) {
        if let SubState::Durable { announce_drops, .. } = &mut self.state {
            *announce_drops = false;
        }
    }

    /// The next batch(es) to send. History is read from the log without any drop; once the
    /// subscription has caught up with the fanout it joins live delivery.
    pub async fn next(&mut self) -> SubEvent {
        loop {
            match &mut self.state {
                SubState::Ephemeral { queue, shard, .. } => {
                    if shard.closed.load(Ordering::Acquire) {
                        return SubEvent::Closed;
                    }
                    if let Some(end) = not_leading(shard) {
                        return end;
                    }
                    match queue.recv().await {
                        Some(Delivery::Batch(b)) => return SubEvent::Batches(b),
                        Some(Delivery::Lagged { resume_offset }) => {
                            return SubEvent::Lagged { resume_offset };
                        }
                        // Ended because the shard moved or was fenced: say so, so the
                        // subscriber resumes on its leader.
                        None => return not_leading(shard).unwrap_or(SubEvent::Closed),
                    }
                }
                SubState::Durable {
                    shard,
                    pos,
                    queue,
                    id,
                    tenant,
                    capacity,
                    max_bytes,
                    announce_drops,
                } => {
                    if shard.closed.load(Ordering::Acquire) {
                        return SubEvent::Closed;
                    }
                    if let Some(end) = not_leading(shard) {
                        return end;
                    }
                    if let Some(q) = queue {
                        return match q.recv().await {
                            // Joined the fanout below the start offset: skip what lies
                            // wholly before it.
                            Some(Delivery::Batch(b)) if b.next_offset <= *pos => continue,
                            Some(Delivery::Batch(b)) => SubEvent::Batches(b),
                            Some(Delivery::Lagged { resume_offset }) => {
                                SubEvent::Lagged { resume_offset }
                            }
                            None => not_leading(shard).unwrap_or(SubEvent::Closed),
                        };
                    }
                    let tier = shard.tier.as_ref().expect("durable shard has tiers");
                    // Join live delivery once caught up with the fanout's cursor.
                    {
                        let mut inner = shard.fanout.inner.lock();
                        if *pos >= inner.cursor {
                            let (q, rx) = sub_queue(
                                *id,
                                *capacity,
                                *max_bytes,
                                tenant,
                                *announce_drops,
                                *pos,
                            );
                            inner.subscribers.push(q);
                            *queue = Some(rx);
                            continue;
                        }
                    }
                    let cursor = shard.fanout.inner.lock().cursor;
                    match tier.read(*pos, self.read_limit, Some(cursor)).await {
                        Ok(read) if !read.batches.is_empty() => {
                            let batch = LiveBatch {
                                first_offset: *pos,
                                next_offset: read.next_offset,
                                bytes: read.batches,
                            };
                            *pos = read.next_offset;
                            return SubEvent::Batches(batch);
                        }
                        Ok(read) if read.tier == Tier::Cold => {
                            // The rest of an object is past the cursor's bound or empty:
                            // continue after it.
                            *pos = read.next_offset.max(*pos + 1).min(cursor);
                        }
                        Ok(_) => {
                            // No whole batch below the cursor from here: a gap up to it.
                            *pos = (*pos).max(cursor);
                        }
                        Err(ColdError::TooOld { earliest, .. }) if *pos < earliest => {
                            // Retention removed what we were about to read; resume at the
                            // earliest retained offset (the client sees the jump in offsets).
                            *pos = earliest;
                        }
                        Err(e) => {
                            warn!(shard = %shard.key, error = %e, "subscription read failed");
                            return SubEvent::Failed(cold_error(&e));
                        }
                    }
                }
            }
        }
    }
}

/// How a subscription of a cluster's shard ends once this broker no longer leads it.
fn not_leading(shard: &Shard) -> Option<SubEvent> {
    let repl = shard.repl.as_ref()?;
    let role = repl.role.borrow().clone();
    let (code, reason) = match role {
        Role::Leader { .. } => return None,
        Role::Fenced { .. } => (codes::SHARD_UNAVAILABLE, "fenced"),
        Role::Unavailable { .. } => (codes::SHARD_UNAVAILABLE, "leader_unavailable"),
        Role::Follower { .. } | Role::Unplaced => (codes::NOT_LEADER, "not_leader"),
    };
    Some(SubEvent::Failed(
        err(
            code,
            reason,
            format!(
                "shard {}: this broker no longer leads it; resume on the leader",
                shard.key
            ),
        )
        .retry_after(200),
    ))
}

impl Drop for Subscription {
    fn drop(&mut self) {
        match &self.state {
            SubState::Durable { shard, id, .. } | SubState::Ephemeral { shard, id, .. } => {
                shard.fanout.remove(*id)
            }
        }
    }
}

/// A stream as a pull reader (the Kafka listener) needs to know it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamShape {
    pub name: String,
    pub shards: u32,
    pub durable: bool,
    /// 1 at creation, +1 per alter.
    pub version: u64,
}

/// A durable shard's readable range: `[earliest, high_watermark)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardBounds {
    pub earliest: u64,
    pub high_watermark: u64,
}

/// What [`Broker::fetch`] read.
#[derive(Debug, Clone)]
pub struct ShardRead {
    /// Whole stored batches; the first holds the requested offset (and may start before it).
    pub batches: Bytes,
    /// The offset to read next.
    pub next_offset: u64,
    pub earliest: u64,
    pub high_watermark: u64,
}

/// One shard's placement as the Kafka listener describes a partition.
#[derive(Debug, Clone, Default)]
pub struct PartitionRoute {
    /// The leader, if it is alive.
    pub leader: Option<u64>,
    pub generation: u64,
    pub replicas: Vec<u64>,
    pub in_sync: Vec<u64>,
}

/// The broker's state.
pub struct Broker {
    config: BrokerConfig,
    meta: MetaHandle,
    metrics: Arc<Metrics>,
    registry: watch::Receiver<Arc<Registry>>,
    shards: Mutex<HashMap<ShardKey, Arc<Shard>>>,
    queues: TenantQueues,
    next_sub_id: AtomicU64,
    stopping: AtomicBool,
    tier_store: TierStore,
    cold_cache: ColdCache,
    /// Hot history blocks shared by catching-up subscribers of every shard.
    hot_reads: Arc<felix_hot::ReadCache>,
    tier_observer: Arc<dyn TierObserver>,
    /// Part of a cluster: shards have leaders and replicas (else this node leads all).
    cluster: bool,
    /// This broker, for tasks it starts from `&self`.
    self_ref: std::sync::OnceLock<std::sync::Weak<Broker>>,
    lease: Arc<Lease>,
    /// The internal HTTP client to other brokers (replication fetches, forwarded
    /// publishes), one connection pool for both.
    peers: crate::replication::ReplClient,
    /// The data volume's free space and the reserve durable publishes leave.
    disk: Arc<crate::disk::DiskSpace>,
}

fn settings_to_config(s: &StreamSettings) -> StreamConfig {
    StreamConfig {
        durable: Some(s.durability == Durability::Durable),
        consistency: Some(
            match s.consistency {
                Consistency::Leader => "leader",
                Consistency::Quorum => "quorum",
            }
            .to_owned(),
        ),
        replicas: Some(s.replicas),
        shards: Some(s.shards),
        segment_bytes: Some(s.segment_bytes),
        segment_ms: Some(s.segment_ms),
        retention_ms: Some(s.retention_ms.unwrap_or(0)),
        retention_bytes: Some(s.retention_bytes.unwrap_or(0)),
        hot_retention_ms: Some(s.hot_retention_ms.unwrap_or(HOT_UNLIMITED)),
        hot_retention_bytes: Some(s.hot_retention_bytes.unwrap_or(HOT_UNLIMITED)),
        tiered: Some(s.tiered),
    }
}

/// The typed refusal for an unknown tenant or namespace, checked against the registry.
fn require_namespace(reg: &Registry, tenant: &str, namespace: &str) -> Result<(), ErrorBody> {
    if !reg.has_tenant(tenant) {
        return Err(err(
            codes::UNKNOWN_TENANT,
            "unknown_tenant",
            format!("unknown tenant {tenant:?}"),
        ));
    }
    if !reg.has_namespace(tenant, namespace) {
        return Err(err(
            codes::UNKNOWN_NAMESPACE,
            "unknown_namespace",
            format!("unknown namespace {tenant}/{namespace}"),
        ));
    }
    Ok(())
}

fn consistency(s: &str) -> Result<Consistency, ErrorBody> {
    match s {
        "leader" => Ok(Consistency::Leader),
        "quorum" => Ok(Consistency::Quorum),
        other => Err(err(
            codes::INVALID_ARGUMENT,
            "invalid_argument",
            format!("consistency {other:?} is not leader or quorum"),
        )),
    }
}

/// A total-retention setting from the protocol: `0` means no limit.
fn limit(v: Option<u64>) -> Option<Option<u64>> {
    v.map(|v| (v > 0).then_some(v))
}

/// A hot-retention setting from the protocol: `0` keeps no uploaded segment locally, and
/// [`HOT_UNLIMITED`] (`u64::MAX`) means no limit.
fn hot_limit(v: Option<u64>) -> Option<Option<u64>> {
    v.map(|v| (v != HOT_UNLIMITED).then_some(v))
}

const HOT_UNLIMITED: u64 = u64::MAX;

impl Broker {
    /// Starts the broker's data path on top of a running control-plane node.
    pub async fn start(
        config: &BrokerConfig,
        meta: MetaHandle,
        metrics: Arc<Metrics>,
    ) -> anyhow::Result<Arc<Broker>> {
        std::fs::create_dir_all(config.data_dir.join("streams"))?;
        let registry = meta.registry();
        // Opening the store does no I/O: a broker whose object store is down still starts
        // and serves every hot tail; the probe below says what is unavailable.
        let tier_store = TierStore::open(&config.store_config())
            .await
            .map_err(|e| anyhow::anyhow!("object store {}: {e}", config.object_store))?;
        let cold_cache = ColdCache::open(tier_store.clone(), config.cache_config())
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        tokio::spawn(probe_object_store(tier_store.clone(), metrics.clone()));
        let tier_observer: Arc<dyn TierObserver> =
            Arc::new(crate::metrics::TierMetrics::new(metrics.clone()));
        let disk = crate::disk::DiskSpace::new(
            &config.data_dir,
            config.disk_reserve_bytes,
            metrics.disk_free_bytes.clone(),
        )
        .map_err(|e| anyhow::anyhow!("free space of {}: {e}", config.data_dir.display()))?;
        info!(
            reserve_bytes = disk.reserve(),
            "data volume reserve for the control plane"
        );
        tokio::spawn(disk.clone().run());
        let broker = Arc::new(Broker {
            disk,
            config: config.clone(),
            queues: TenantQueues::new(config.pub_queue_depth),
            meta,
            metrics,
            registry,
            shards: Mutex::new(HashMap::new()),
            next_sub_id: AtomicU64::new(1),
            stopping: AtomicBool::new(false),
            tier_store,
            cold_cache,
            hot_reads: Arc::new(felix_hot::ReadCache::new(config.hot_read_cache_bytes)),
            tier_observer,
            cluster: config.cluster.len() > 1,
            self_ref: std::sync::OnceLock::new(),
            lease: Arc::new(Lease::default()),
            peers: crate::replication::ReplClient::default(),
        });
        let _ = broker.self_ref.set(Arc::downgrade(&broker));
        // A single node renews too, so the control plane's view of it stays alive.
        let every = Duration::from_millis((config.lease_ms / 4).max(50));
        tokio::spawn(crate::replication::keep_lease(
            broker.meta.clone(),
            config.node_id,
            broker.lease.clone(),
            every,
        ));
        if broker.cluster {
            tokio::spawn(watch_placements(Arc::downgrade(&broker)));
        }
        tokio::spawn(open_durable_shards(Arc::downgrade(&broker)));
        tokio::spawn(watch_deletes(Arc::downgrade(&broker)));
        tokio::spawn(crate::object_deletes::finish_object_deletes(
            Arc::downgrade(&broker),
        ));
        Ok(broker)
    }

    /// Whether a publish with `ack` is answered after the write (else on enqueue, or not
    /// at all for `AckMode::None`).
    fn acks_after_write(&self, ack: AckMode) -> bool {
        match ack {
            AckMode::Commit => true,
            AckMode::Batch => self.config.ack_on_commit,
            AckMode::None => false,
        }
    }

    /// The object store this broker tiers to.
    pub fn tier_store(&self) -> &TierStore {
        &self.tier_store
    }

    /// The cold-read cache.
    pub fn cold_cache(&self) -> &ColdCache {
        &self.cold_cache
    }

    /// Copies counters kept as plain atomics (cache, object store) into the metrics.
    pub fn refresh_metrics(&self) {
        let m = &self.metrics;
        let cache = self.cold_cache.stats();
        Metrics::sync_counter(&m.cold_cache_hits, cache.hits.load(Ordering::Relaxed));
        Metrics::sync_counter(&m.cold_cache_misses, cache.misses.load(Ordering::Relaxed));
        Metrics::sync_counter(&m.hot_read_cache_hits, self.hot_reads.hits());
        Metrics::sync_counter(&m.hot_read_cache_misses, self.hot_reads.misses());
        let store = self.tier_store.stats();
        Metrics::sync_counter(&m.tier_store_gets, store.gets);
        Metrics::sync_counter(&m.tier_store_get_bytes, store.get_bytes);
        Metrics::sync_counter(&m.tier_store_puts, store.puts);
        m.lease_remaining.set(self.lease.remaining().as_secs_f64());
    }

    /// Ready to serve: the control plane has a leader and the registry is loaded.
    pub fn is_ready(&self) -> bool {
        !self.stopping.load(Ordering::Acquire) && self.meta.is_ready()
    }

    /// Connections each listener holds at once (`max_connections`).
    pub fn max_connections(&self) -> usize {
        self.config.max_connections
    }

    /// The metrics this broker reports into.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// `subscriber_egress_max_bytes`: what one connection's subscriptions may hold between
    /// their queues and QUIC, split equally among them.
    pub fn subscriber_egress_max_bytes(&self) -> usize {
        self.config.subscriber_egress_max_bytes
    }

    /// The largest frame a client may send.
    pub fn max_frame_bytes(&self) -> usize {
        self.config.max_frame_bytes
    }

    /// The broker's id.
    pub fn broker_id(&self) -> u64 {
        self.config.node_id
    }

    /// Tenants and their namespaces, from the local registry.
    pub fn tenants(&self) -> BTreeMap<String, BTreeSet<String>> {
        self.registry.borrow().tenants.clone()
    }

    async fn propose(&self, cmd: Command) -> Result<Applied, ErrorBody> {
        let applied = self.meta.propose(cmd).await.map_err(meta_error)?;
        if self.cluster {
            // Proposed through the control plane's leader: wait until this node has applied
            // it too, so the answer (and the client's next request here) sees the change.
            self.meta.read(|_| ()).await.map_err(meta_error)?;
        }
        Ok(applied)
    }

    pub async fn create_tenant(&self, name: &str) -> Result<(), ErrorBody> {
        self.propose(Command::CreateTenant {
            name: name.to_owned(),
        })
        .await
        .map(|_| ())
    }

    pub async fn create_namespace(&self, tenant: &str, name: &str) -> Result<(), ErrorBody> {
        self.propose(Command::CreateNamespace {
            tenant: tenant.to_owned(),
            name: name.to_owned(),
        })
        .await
        .map(|_| ())
    }

    pub async fn create_stream(
        &self,
        tenant: &str,
        namespace: &str,
        name: &str,
        config: StreamConfig,
    ) -> Result<StreamInfo, ErrorBody> {
        let d = StreamSettings::default();
        let settings = StreamSettings {
            // The spec: a stream is ephemeral unless declared durable.
            durability: if config.durable.unwrap_or(false) {
                Durability::Durable
            } else {
                Durability::Ephemeral
            },
            consistency: config
                .consistency
                .as_deref()
                .map(consistency)
                .transpose()?
                .unwrap_or_default(),
            // Three copies in a cluster (fewer if it is smaller), one on a single node.
            replicas: config
                .replicas
                .unwrap_or(self.config.cluster.len().clamp(1, 3) as u32),
            shards: config.shards.unwrap_or(1),
            segment_bytes: config.segment_bytes.unwrap_or(self.config.segment_bytes),
            segment_ms: config.segment_ms.unwrap_or(self.config.segment_ms),
            retention_ms: limit(config.retention_ms).flatten(),
            retention_bytes: limit(config.retention_bytes).flatten(),
            hot_retention_ms: hot_limit(config.hot_retention_ms).flatten(),
            hot_retention_bytes: hot_limit(config.hot_retention_bytes).flatten(),
            tiered: config.tiered.unwrap_or(d.tiered),
        };
        self.propose(Command::CreateStream {
            tenant: tenant.to_owned(),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            settings,
        })
        .await?;
        self.describe_stream(tenant, namespace, name).await
    }

    pub async fn alter_stream(
        &self,
        tenant: &str,
        namespace: &str,
        name: &str,
        config: StreamConfig,
    ) -> Result<StreamInfo, ErrorBody> {
        if config.durable.is_some() {
            return Err(err(
                codes::INVALID_ARGUMENT,
                "invalid_argument",
                "durability cannot be changed on a live stream",
            ));
        }
        let patch = StreamSettingsPatch {
            consistency: config.consistency.as_deref().map(consistency).transpose()?,
            replicas: config.replicas,
            shards: config.shards,
            segment_bytes: config.segment_bytes,
            segment_ms: config.segment_ms,
            retention_ms: limit(config.retention_ms),
            retention_bytes: limit(config.retention_bytes),
            hot_retention_ms: hot_limit(config.hot_retention_ms),
            hot_retention_bytes: hot_limit(config.hot_retention_bytes),
            tiered: config.tiered,
        };
        self.propose(Command::AlterStream {
            tenant: tenant.to_owned(),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            patch,
            expected_version: None,
        })
        .await?;
        let info = self.describe_stream(tenant, namespace, name).await?;
        // Apply rolling and retention settings to open shard logs at once.
        let shards: Vec<Arc<Shard>> = self
            .shards
            .lock()
            .values()
            .filter(|s| {
                s.key.tenant == tenant && s.key.namespace == namespace && s.key.stream == name
            })
            .cloned()
            .collect();
        for shard in shards {
            if let Some(log) = &shard.log {
                let c = info.config.clone();
                log.alter(|l| {
                    l.segment_bytes = c.segment_bytes.unwrap_or(l.segment_bytes);
                    l.segment_age = c.segment_ms.map(Duration::from_millis);
                });
            }
            // New retention settings apply now rather than at the next periodic pass.
            shard.retention_now.notify_one();
        }
        Ok(info)
    }

    fn stream_settings(
        &self,
        tenant: &str,
        namespace: &str,
        name: &str,
    ) -> Result<(u64, StreamSettings), ErrorBody> {
        let reg = self.registry.borrow();
        require_namespace(&reg, tenant, namespace)?;
        let s = reg.stream(tenant, namespace, name).ok_or_else(|| {
            err(
                codes::UNKNOWN_STREAM,
                "unknown_stream",
                format!("unknown stream {tenant}/{namespace}/{name}"),
            )
        })?;
        Ok((s.version, s.settings.clone()))
    }

    fn info(
        &self,
        tenant: &str,
        namespace: &str,
        name: &str,
        version: u64,
        settings: &StreamSettings,
    ) -> StreamInfo {
        let shards = (0..settings.shards)
            .filter_map(|k| {
                let key = ShardKey {
                    tenant: tenant.to_owned(),
                    namespace: namespace.to_owned(),
                    stream: name.to_owned(),
                    shard: k,
                };
                let shard = self.shards.lock().get(&key).cloned()?;
                Some(match &shard.tier {
                    Some(tier) => shard_info(k, tier),
                    None => ShardInfo {
                        shard: k,
                        first_offset: 0,
                        next_offset: shard.ephemeral_next.load(Ordering::Acquire),
                        hot_first_offset: 0,
                        hot_bytes: 0,
                        cold_bytes: 0,
                        uploaded_end: 0,
                        upload_backlog_segments: 0,
                        upload_backlog_bytes: 0,
                    },
                })
            })
            .collect();
        let stats = self.cold_cache.stats();
        StreamInfo {
            tenant: tenant.to_owned(),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            version,
            config: settings_to_config(settings),
            shards,
            cache_hits: stats.hits.load(Ordering::Relaxed),
            cache_misses: stats.misses.load(Ordering::Relaxed),
        }
    }

    /// Opens every shard of a durable stream, so its upload and retention run.
    fn open_shards(&self, tenant: &str, namespace: &str, name: &str) -> Result<(), ErrorBody> {
        let (_, settings) = self.stream_settings(tenant, namespace, name)?;
        if settings.durability == Durability::Durable {
            for k in 0..settings.shards {
                if self.holds_replica(tenant, namespace, name, k) {
                    self.local_shard(tenant, namespace, name, k)?;
                }
            }
        }
        Ok(())
    }

    /// Whether this broker keeps a copy of the shard: always on a single node; in a
    /// cluster, when the shard's placement names it.
    fn holds_replica(&self, tenant: &str, namespace: &str, name: &str, shard: u32) -> bool {
        if !self.cluster {
            return true;
        }
        let key = ShardKey {
            tenant: tenant.to_owned(),
            namespace: namespace.to_owned(),
            stream: name.to_owned(),
            shard,
        };
        self.registry
            .borrow()
            .placements
            .get(&key)
            .is_some_and(|p| p.replicas.contains(&self.config.node_id))
    }

    /// A stream's segments and objects, per shard, oldest first.
    pub async fn list_segments(
        &self,
        tenant: &str,
        namespace: &str,
        name: &str,
    ) -> Result<Vec<SegmentInfo>, ErrorBody> {
        self.open_shards(tenant, namespace, name)?;
        let (_, settings) = self.stream_settings(tenant, namespace, name)?;
        let mut out = Vec::new();
        for k in 0..settings.shards {
            if !self.holds_replica(tenant, namespace, name, k) {
                continue;
            }
            let (shard, _) = self.local_shard(tenant, namespace, name, k)?;
            if let Some(tier) = &shard.tier {
                out.extend(segment_infos(k, tier));
            }
        }
        Ok(out)
    }

    pub async fn describe_stream(
        &self,
        tenant: &str,
        namespace: &str,
        name: &str,
    ) -> Result<StreamInfo, ErrorBody> {
        self.open_shards(tenant, namespace, name)?;
        let (version, settings) = self.stream_settings(tenant, namespace, name)?;
        Ok(self.info(tenant, namespace, name, version, &settings))
    }

    pub async fn list_streams(
        &self,
        tenant: &str,
        namespace: &str,
    ) -> Result<Vec<StreamInfo>, ErrorBody> {
        let streams: Vec<_> = {
            let reg = self.registry.borrow();
            require_namespace(&reg, tenant, namespace)?;
            reg.streams
                .values()
                .filter(|s| s.tenant == tenant && s.namespace == namespace)
                .map(|s| (s.name.clone(), s.version, s.settings.clone()))
                .collect()
        };
        Ok(streams
            .iter()
            .map(|(name, v, s)| self.info(tenant, namespace, name, *v, s))
            .collect())
    }

    pub async fn delete_stream(
        &self,
        tenant: &str,
        namespace: &str,
        name: &str,
    ) -> Result<(), ErrorBody> {
        // The objects the manifest names, to drop from the cache once the stream is gone.
        let objects: Vec<ObjectRef> = self.meta.local(|s| {
            s.manifests
                .iter()
                .filter(|(k, _)| k.tenant == tenant && k.namespace == namespace && k.stream == name)
                .flat_map(|(_, m)| m.values().filter_map(ObjectRef::of))
                .collect()
        });
        self.propose(Command::DeleteStream {
            tenant: tenant.to_owned(),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        })
        .await?;
        retire_stream(&mut self.shards.lock(), tenant, namespace, name);
        // The objects themselves are removed by the Raft leader's broker, which frees the
        // name once they are gone (object_deletes.rs); this broker drops what it cached.
        for object in &objects {
            self.cold_cache.forget(object);
        }
        let dir = self.stream_dir(tenant, namespace, name);
        if dir.exists()
            && let Err(e) = std::fs::remove_dir_all(&dir)
        {
            warn!(dir = %dir.display(), error = %e, "could not remove a deleted stream's data");
        }
        Ok(())
    }

    fn stream_dir(&self, tenant: &str, namespace: &str, name: &str) -> PathBuf {
        // Names are validated by the control plane ([A-Za-z0-9._-], never "." or ".."), so
        // they are safe path components.
        self.config
            .data_dir
            .join("streams")
            .join(tenant)
            .join(namespace)
            .join(name)
    }

    /// The shard, opened on first use (recovering its log for a durable stream).
    /// A shard this broker serves clients for: in a cluster, only a shard it leads.
    fn shard(
        &self,
        tenant: &str,
        namespace: &str,
        stream: &str,
        shard: u32,
    ) -> Result<(Arc<Shard>, StreamSettings), ErrorBody> {
        let (s, settings) = self.local_shard(tenant, namespace, stream, shard)?;
        self.check_leading(&s)?;
        Ok((s, settings))
    }

    /// Refuses client operations on a shard this broker does not lead now.
    fn check_leading(&self, shard: &Shard) -> Result<(), ErrorBody> {
        let Some(repl) = &shard.repl else {
            return Ok(());
        };
        let role = repl.role.borrow().clone();
        match role {
            Role::Leader { .. } => Ok(()),
            Role::Fenced { .. } => Err(err(
                codes::SHARD_UNAVAILABLE,
                "fenced",
                format!(
                    "shard {}: this broker's lease lapsed, so another broker may lead the shard                      by now; it serves nothing until it knows",
                    shard.key
                ),
            )
            .retry_after(500)),
            Role::Unavailable { why, .. } => Err(err(
                codes::SHARD_UNAVAILABLE,
                "leader_unavailable",
                format!("shard {}: {why}", shard.key),
            )
            .retry_after(1000)),
            Role::Follower { leader, .. } => Err(self.not_leader(&shard.key, Some(leader))),
            Role::Unplaced => {
                let leader = self
                    .registry
                    .borrow()
                    .placements
                    .get(&shard.key)
                    .and_then(|p| p.leader);
                Err(self.not_leader(&shard.key, leader.filter(|l| *l != self.config.node_id)))
            }
        }
    }

    /// `not_leader` naming the shard's leader, or `shard_unavailable` while it has none that
    /// is alive.
    fn not_leader(&self, key: &ShardKey, leader: Option<u64>) -> ErrorBody {
        let reg = self.registry.borrow();
        match leader.and_then(|l| reg.brokers.get(&l)) {
            Some(b) if b.alive => {
                let mut e = err(
                    codes::NOT_LEADER,
                    "not_leader",
                    format!("broker {} leads shard {key}, not this one", b.id),
                );
                e.leader = Some(b.id);
                e.leader_addr = Some(b.client_addr.clone());
                e
            }
            Some(b) => err(
                codes::SHARD_UNAVAILABLE,
                "leader_unavailable",
                format!(
                    "shard {key}: its leader, broker {}, is down; the shard waits for it (a \
                     Leader stream), for a replica to be promoted (a Quorum stream) or for \
                     another broker to take it over (an ephemeral stream)",
                    b.id
                ),
            )
            .retry_after(500),
            None => err(
                codes::SHARD_UNAVAILABLE,
                "no_leader",
                format!("shard {key} has no leader yet"),
            )
            .retry_after(200),
        }
    }

    /// A shard's local state, opened on first use, whatever this broker's role for it.
    pub(crate) fn local_shard(
        &self,
        tenant: &str,
        namespace: &str,
        stream: &str,
        shard: u32,
    ) -> Result<(Arc<Shard>, StreamSettings), ErrorBody> {
        let (_, settings) = self.stream_settings(tenant, namespace, stream)?;
        let incarnation = self
            .registry
            .borrow()
            .stream(tenant, namespace, stream)
            .map_or(0, |s| s.incarnation);
        if shard >= settings.shards {
            return Err(err(
                codes::UNKNOWN_SHARD,
                "unknown_shard",
                format!(
                    "stream {tenant}/{namespace}/{stream} has {} shards; shard {shard} does not exist",
                    settings.shards
                ),
            ));
        }
        let key = ShardKey {
            tenant: tenant.to_owned(),
            namespace: namespace.to_owned(),
            stream: stream.to_owned(),
            shard,
        };
        let mut shards = self.shards.lock();
        match shards.get(&key) {
            Some(s) if s.incarnation == incarnation => return Ok((s.clone(), settings)),
            // Still open here from a deleted stream of the same name (this broker has not
            // acted on the delete yet): that stream is over, on every shard.
            Some(_) => retire_stream(&mut shards, tenant, namespace, stream),
            None => {}
        }
        let fanout = Arc::new(Fanout::default());
        let closed = Arc::new(AtomicBool::new(false));
        let (stop_tasks, stop_rx) = watch::channel(false);
        let mut producers = ProducerTable::default();
        // In a cluster every shard has a role (an ephemeral one too: one leader per shard).
        let repl = self.cluster.then(|| Arc::new(ReplState::new(0)));
        // The uploader re-reads the control plane before each upload, and a new leader
        // refreshes this copy (`refresh_manifest`).
        let manifest_state = self.meta.local(|s| ManifestState::of(s, &key));
        let log = if settings.durability == Durability::Durable {
            let stream_dir = self.stream_dir(tenant, namespace, stream);
            crate::stream_files::claim(&stream_dir, incarnation).map_err(|e| {
                err(
                    codes::SHARD_UNAVAILABLE,
                    "shard_unavailable",
                    format!("cannot prepare {}: {e}", stream_dir.display()),
                )
                .retry_after(1000)
            })?;
            let dir = stream_dir.join(shard.to_string());
            let log = ShardLog::open(
                &dir,
                LogConfig {
                    shard: key.to_string(),
                    segment_bytes: settings.segment_bytes,
                    segment_age: Some(Duration::from_millis(settings.segment_ms)),
                    fsync: self.config.fsync_policy(),
                    max_batch_bytes: self.config.max_batch_bytes,
                    retention: felix_hot::RetentionPolicy {
                        max_bytes: settings.hot_retention_bytes,
                        max_age: settings.hot_retention_ms.map(Duration::from_millis),
                    },
                    // A wiped or lost local volume: continue after the uploaded history
                    // instead of handing out its offsets again.
                    start_offset: manifest_state.uploaded_end(),
                    ..LogConfig::default()
                },
            )
            .map_err(|e| log_error(&e))?;
            if repl.is_some() {
                log.set_write_gate(crate::enqueue_ack::write_gate(self.lease.clone()));
            }
            let visible = match &repl {
                Some(r) => r.visible.subscribe(),
                None => log.watch_committed(),
            };
            fanout.inner.lock().cursor = *visible.borrow();
            producers = ProducerTable::rebuild(&log).map_err(|e| log_error(&e))?;
            tokio::spawn(snapshot_producers_at_seal(
                log.clone(),
                closed.clone(),
                stop_rx.clone(),
            ));
            tokio::spawn(follow_log(
                log.clone(),
                visible,
                fanout.clone(),
                closed.clone(),
                self.metrics.clone(),
                stop_rx.clone(),
            ));
            info!(shard = %key, next_offset = log.next_offset(), "opened durable shard");
            Some(log)
        } else {
            None
        };
        let retention_now = Arc::new(tokio::sync::Notify::new());
        let tier = log.as_ref().map(|log| {
            let manifest = Arc::new(Manifest::new(manifest_state));
            log.mark_uploaded_below(manifest.uploaded_end());
            let tier = Arc::new(
                TieredShard::new(
                    key.clone(),
                    log.clone(),
                    manifest.clone(),
                    Some(self.cold_cache.clone()),
                )
                .with_hot_read_cache(self.hot_reads.clone()),
            );
            self.spawn_shard_tasks(&tier, repl.clone(), stop_rx, retention_now.clone());
            tier
        });
        let s = Arc::new(Shard {
            key: key.clone(),
            log,
            repl: repl.clone(),
            fanout,
            ephemeral_next: AtomicU64::new(0),
            closed,
            producers: tokio::sync::Mutex::new(producers),
            tier,
            stop_tasks,
            retention_now,
            incarnation,
        });
        shards.insert(key.clone(), s.clone());
        drop(shards);
        if let Some(repl) = repl {
            repl.placement
                .send_replace(self.registry.borrow().placements.get(&key).cloned());
            let me = self.self_ref.get().cloned().unwrap_or_default();
            match (&s.log, me.upgrade()) {
                (Some(_), _) => {
                    tokio::spawn(crate::replication::drive_shard(me, s.clone()));
                }
                (None, Some(me)) => crate::ephemeral::lead(&me, &s, s.stop_tasks.subscribe()),
                (None, None) => {}
            }
        }
        Ok((s, settings))
    }

    /// Starts a durable shard's uploader and retention tasks.
    fn spawn_shard_tasks(
        &self,
        tier: &Arc<TieredShard>,
        repl: Option<Arc<ReplState>>,
        stop: watch::Receiver<bool>,
        retention_now: Arc<tokio::sync::Notify>,
    ) {
        let key = tier.key.clone();
        let registry = self.registry.clone();
        let settings = move || -> Option<StreamSettings> {
            registry
                .borrow()
                .streams
                .get(&felix_meta::model::stream_key(
                    &key.tenant,
                    &key.namespace,
                    &key.stream,
                ))
                .map(|s| s.settings.clone())
        };
        let settings: Arc<dyn Fn() -> Option<StreamSettings> + Send + Sync> = Arc::new(settings);
        let enabled = settings.clone();
        let uploader = Uploader::new(
            tier.key.clone(),
            tier.log.clone(),
            tier.manifest.clone(),
            self.tier_store.clone(),
            self.meta.clone(),
            self.config.node_id,
            UploaderConfig {
                encode: felix_cold::segment::EncodeOptions {
                    row_group_bytes: self.config.tier_row_group_bytes,
                    ..Default::default()
                },
                ..UploaderConfig::default()
            },
            self.tier_observer.clone(),
        )
        .with_enabled({
            let repl = repl.clone();
            // In a cluster only the leader uploads, and only what readers may see (on a
            // Quorum stream, what a majority holds), so a failover cannot cut it.
            Arc::new(move || {
                enabled().is_some_and(|s| s.tiered)
                    && repl.as_ref().is_none_or(|r| r.leading().is_some())
            })
        });
        let uploader = match &repl {
            Some(r) => {
                let visible = r.visible.subscribe();
                uploader.with_limit(Arc::new(move || *visible.borrow()))
            }
            None => uploader,
        };
        tokio::spawn(uploader.run(stop.clone()));
        tokio::spawn(run_retention(
            tier.clone(),
            repl,
            self.meta.clone(),
            settings,
            Duration::from_millis(self.config.retention_check_ms),
            retention_now,
            stop,
        ));
    }

    /// Publishes the batches in `body` (one or more RecordBatch v2) to one shard. With
    /// `AckMode::None` nothing is answered (`Ok(None)`); otherwise the first and last
    /// offsets given.
    ///
    /// In a cluster, a publish for a shard another broker leads is forwarded to it over the
    /// internal network and answered with its answer (it is checked again there).
    pub async fn publish(
        &self,
        tenant: &str,
        namespace: &str,
        stream: &str,
        shard_no: u32,
        ack: AckMode,
        body: Bytes,
    ) -> Result<Option<(u64, u64)>, ErrorBody> {
        let result = self
            .publish_here(tenant, namespace, stream, shard_no, ack, body.clone())
            .await;
        let leader = match &result {
            Err(e) if self.cluster && e.code == codes::NOT_LEADER => e.leader,
            _ => None,
        };
        let Some(addr) = leader.and_then(|l| self.internal_addr_of(l)) else {
            return result;
        };
        let req = crate::replication::ForwardedPublish {
            tenant: tenant.to_owned(),
            namespace: namespace.to_owned(),
            stream: stream.to_owned(),
            shard: shard_no,
            ack,
        };
        // Long enough for a Quorum acknowledgement at the owner.
        let timeout =
            Duration::from_millis(self.config.publish_quorum_timeout_ms) + Duration::from_secs(5);
        self.metrics.publishes_forwarded.inc();
        self.peers.forward_publish(&addr, &req, body, timeout).await
    }

    /// Publishes on this broker only (a forwarded publish lands here).
    pub(crate) async fn publish_here(
        &self,
        tenant: &str,
        namespace: &str,
        stream: &str,
        shard_no: u32,
        ack: AckMode,
        body: Bytes,
    ) -> Result<Option<(u64, u64)>, ErrorBody> {
        let m = &self.metrics;
        let t = Metrics::tenant(tenant);
        m.publish_requests.get_or_create(&t).inc();
        let mut result = self
            .publish_inner(tenant, namespace, stream, shard_no, ack, body.clone())
            .await;
        if let Err(e) = &result
            && self.catch_up_if_unknown(e).await
        {
            result = self
                .publish_inner(tenant, namespace, stream, shard_no, ack, body)
                .await;
        }
        if let Err(e) = &result {
            m.publish_errors
                .get_or_create(&TenantReason {
                    tenant: tenant.to_owned(),
                    reason: e.reason.clone(),
                })
                .inc();
        }
        result
    }

    async fn publish_inner(
        &self,
        tenant: &str,
        namespace: &str,
        stream: &str,
        shard_no: u32,
        ack: AckMode,
        body: Bytes,
    ) -> Result<Option<(u64, u64)>, ErrorBody> {
        if self.stopping.load(Ordering::Acquire) {
            return Err(err(
                codes::SHARD_UNAVAILABLE,
                "stopping",
                "the broker is stopping",
            )
            .retry_after(1000));
        }
        let (shard, settings) = self.shard(tenant, namespace, stream, shard_no)?;
        let quorum = settings.consistency == Consistency::Quorum;
        // Validate every batch before anything is written: a bad request changes nothing.
        let mut batches = Vec::new();
        let mut records = 0u64;
        for item in BatchIter::new(&body, self.config.max_batch_bytes) {
            match item {
                Ok((h, bytes)) => {
                    records += h.records_count.max(0) as u64;
                    batches.push((h, body.slice_ref(bytes)));
                }
                Err((pos, felix_wire::WireError::InvalidLength { length, .. }))
                    if length as usize + 12 > self.config.max_batch_bytes =>
                {
                    return Err(err(
                        codes::RECORD_TOO_LARGE,
                        "record_too_large",
                        format!(
                            "batch at byte {pos} is {} bytes; the limit is {} (max_batch_bytes)",
                            length + 12,
                            self.config.max_batch_bytes
                        ),
                    ));
                }
                Err((pos, e)) => {
                    return Err(err(
                        codes::BAD_REQUEST,
                        "invalid_batch",
                        format!("batch at byte {pos}: {e}"),
                    ));
                }
            }
        }
        if batches.is_empty() {
            return Err(err(
                codes::BAD_REQUEST,
                "invalid_batch",
                "a publish needs at least one record batch",
            ));
        }

        // Backpressure: the tenant's own publish slots.
        let slots = self.queues.of(tenant);
        let commit_ack = self.acks_after_write(ack);
        let permit = match slots.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                let action = match ack {
                    AckMode::None if !self.config.pub_ingress_wait => "shed",
                    // With pub_ingress_wait a fire-and-forget publish waits as a
                    // commit-acked one does.
                    AckMode::None => "waited",
                    _ if commit_ack => "waited",
                    _ => "rejected",
                };
                self.metrics
                    .publish_queue_full
                    .get_or_create(&TenantAction {
                        tenant: tenant.to_owned(),
                        action: action.to_owned(),
                    })
                    .inc();
                let full = || {
                    err(
                        codes::OVERLOADED,
                        "publish_queue_full",
                        format!(
                            "tenant {tenant}'s publish queue ({} slots) is full",
                            self.queues.depth
                        ),
                    )
                    .retry_after(50)
                };
                match action {
                    "waited" => {
                        let wait = Duration::from_millis(self.config.publish_queue_wait_timeout_ms);
                        match tokio::time::timeout(wait, slots.acquire_owned()).await {
                            Ok(Ok(p)) => p,
                            // Nobody to tell: shed after all, and counted as such.
                            _ if ack == AckMode::None => {
                                self.metrics
                                    .publish_queue_full
                                    .get_or_create(&TenantAction {
                                        tenant: tenant.to_owned(),
                                        action: "shed".to_owned(),
                                    })
                                    .inc();
                                return Ok(None);
                            }
                            _ => return Err(full()),
                        }
                    }
                    "shed" => return Ok(None),
                    _ => return Err(full()),
                }
            }
        };
        let bytes_len = body.len() as u64;
        let result = match &shard.log {
            Some(log) => {
                self.publish_durable(&shard, log, batches, ack, quorum)
                    .await
            }
            None => crate::ephemeral::publish(&shard, batches, &self.metrics).await,
        };
        drop(permit);
        if result.is_ok() {
            let t = Metrics::tenant(tenant);
            self.metrics
                .publish_records
                .get_or_create(&t)
                .inc_by(records);
            self.metrics
                .publish_bytes
                .get_or_create(&t)
                .inc_by(bytes_len);
        }
        match (ack, result) {
            (AckMode::None, _) => Ok(None),
            (_, r) => r.map(Some),
        }
    }

    async fn publish_durable(
        &self,
        shard: &Shard,
        log: &ShardLog,
        batches: Vec<(BatchHeader, Bytes)>,
        ack: AckMode,
        quorum: bool,
    ) -> Result<(u64, u64), ErrorBody> {
        let bytes: usize = batches.iter().map(|(_, b)| b.len()).sum();
        self.disk.check(bytes as u64)?;
        let mut tickets = Vec::with_capacity(batches.len());
        let mut duplicate_range: Option<(u64, u64)> = None;
        {
            let mut producers = shard.producers.lock().await;
            for (h, bytes) in batches {
                match producers.check(&h) {
                    SeqCheck::Append => {
                        let ticket = log
                            .append(bytes.to_vec())
                            .await
                            .map_err(|e| log_error(&e))?;
                        producers.record(&h, ticket.base_offset, ticket.last_offset);
                        tickets.push(ticket);
                    }
                    SeqCheck::Duplicate {
                        base_offset,
                        last_offset,
                    } => {
                        let r = duplicate_range.get_or_insert((base_offset, last_offset));
                        r.1 = r.1.max(last_offset);
                    }
                    SeqCheck::Reject(e) => return Err(e),
                }
            }
        }
        if tickets.is_empty() {
            // Every batch was already in the log: answer with where it landed. A duplicate
            // may still be on its way to disk, so wait for the log to commit past it.
            let (first, last) = duplicate_range.unwrap_or((0, 0));
            if shard.repl.is_some() && ack != AckMode::None {
                self.await_replicated(shard, last, quorum).await?;
            } else {
                let mut committed = log.watch_committed();
                let _ = committed.wait_for(|c| *c > last).await;
            }
            return Ok((first, last));
        }
        let first = duplicate_range
            .map_or(u64::MAX, |d| d.0)
            .min(tickets.first().map_or(u64::MAX, |t| t.base_offset));
        let last = tickets.last().map_or(0, |t| t.last_offset);
        let commit_ack = self.acks_after_write(ack);
        if commit_ack {
            for t in tickets {
                t.committed().await.map_err(|e| log_error(&e))?;
            }
        } else {
            // Answered on enqueue, unless the lease is near its end (see `enqueue_ack`). A
            // replicated Quorum publish is answered only once the mark covers the write.
            let replicated_quorum = quorum && shard.repl.is_some();
            let lease = shard
                .repl
                .as_ref()
                .filter(|_| !quorum)
                .map(|_| &*self.lease);
            let margin = Duration::from_millis(self.config.lease_ms / 2);
            let acked = ack == AckMode::Batch && !replicated_quorum;
            crate::enqueue_ack::settle(tickets, lease, margin, acked, &self.metrics).await?;
        }
        if shard.repl.is_some() && ack != AckMode::None {
            self.await_replicated(shard, last, quorum).await?;
        }
        Ok((first, last))
    }

    /// In a cluster, before an acknowledgement goes out: on a Quorum stream, waits until the
    /// quorum mark (recorded in the control plane) covers `last`, at most
    /// `publish_quorum_timeout_ms`; on a Leader stream, re-checks the lease.
    async fn await_replicated(
        &self,
        shard: &Shard,
        last: u64,
        quorum: bool,
    ) -> Result<(), ErrorBody> {
        let Some(repl) = &shard.repl else {
            return Ok(());
        };
        if quorum {
            let mut mark = repl.visible.subscribe();
            let wait = Duration::from_millis(self.config.publish_quorum_timeout_ms);
            return match tokio::time::timeout(wait, mark.wait_for(|m| *m > last)).await {
                Ok(Ok(_)) => Ok(()),
                _ => {
                    self.metrics.quorum_timeouts.inc();
                    Err(err(
                        codes::QUORUM_TIMEOUT,
                        "quorum_timeout",
                        format!(
                            "shard {}: no majority of replicas confirmed offset {last} within \
                             {wait:?}; the record may or may not be stored (retry through an \
                             idempotent producer)",
                            shard.key
                        ),
                    )
                    .retry_after(500))
                }
            };
        }
        if self.lease.holds() {
            Ok(())
        } else {
            Err(err(
                codes::SHARD_UNAVAILABLE,
                "fenced",
                format!(
                    "shard {}: the write landed on this broker but its lease lapsed, so it \
                     cannot vouch for it",
                    shard.key
                ),
            )
            .retry_after(500))
        }
    }

    /// Opens a subscription on one shard.
    pub async fn subscribe(
        &self,
        tenant: &str,
        namespace: &str,
        stream: &str,
        shard_no: u32,
        from: StartAt,
    ) -> Result<Subscription, ErrorBody> {
        let (shard, _) = match self.shard(tenant, namespace, stream, shard_no) {
            Err(e) if self.catch_up_if_unknown(&e).await => {
                self.shard(tenant, namespace, stream, shard_no)?
            }
            other => other?,
        };
        let id = self.next_sub_id.fetch_add(1, Ordering::Relaxed);
        let capacity = self.config.subscriber_queue_capacity.max(1);
        let max_bytes = self.config.subscriber_queue_max_bytes;
        let Some(log) = &shard.log else {
            // Ephemeral: live only.
            let (q, queue) = sub_queue(id, capacity, max_bytes, tenant, false, 0);
            let live = {
                let mut inner = shard.fanout.inner.lock();
                inner.subscribers.push(q);
                shard.ephemeral_next.load(Ordering::Acquire)
            };
            return Ok(Subscription {
                read_limit: MAX_HISTORY_READ,
                start_offset: live,
                live_offset: live,
                state: SubState::Ephemeral {
                    shard: shard.clone(),
                    queue,
                    id,
                },
            });
        };
        // The committed end, not the fanout's cursor: the fanout may not have caught up with
        // a publish that was just acknowledged, and a replay sent right after the ack must
        // find it. A start above the cursor joins live delivery at the cursor and skips
        // what lies below its start.
        let _ = log;
        let live = shard.visible_end();
        let tier = shard.tier.as_ref().expect("durable shard has tiers");
        let first = tier.earliest_offset();
        let start = match from {
            StartAt::Earliest => first,
            StartAt::Latest => live,
            StartAt::Offset(o) if o < first => {
                return Err(cold_error(&ColdError::TooOld {
                    requested: o,
                    earliest: first,
                }));
            }
            StartAt::Offset(o) => {
                if o > live {
                    return Err(err(
                        codes::OFFSET_OUT_OF_RANGE,
                        "offset_out_of_range",
                        format!("offset {o} is outside [{first}, {live}] on this shard"),
                    ));
                }
                o
            }
            StartAt::Timestamp(ts) => tier
                .offset_for_time(ts)
                .await
                .map_err(|e| cold_error(&e))?
                .unwrap_or(live)
                .clamp(first, live),
        };
        Ok(Subscription {
            read_limit: MAX_HISTORY_READ,
            start_offset: start,
            live_offset: live,
            state: SubState::Durable {
                shard: shard.clone(),
                pos: start,
                queue: None,
                id,
                tenant: tenant.to_owned(),
                capacity,
                max_bytes,
                announce_drops: true,
            },
        })
    }

    /// A stream's name, shard count and durability, from the local registry (no shard is
    /// opened).
    pub fn stream_shape(
        &self,
        tenant: &str,
        namespace: &str,
        name: &str,
    ) -> Result<StreamShape, ErrorBody> {
        let (version, settings) = self.stream_settings(tenant, namespace, name)?;
        Ok(StreamShape {
            name: name.to_owned(),
            shards: settings.shards,
            durable: settings.durability == Durability::Durable,
            version,
        })
    }

    /// Every stream of a namespace, as [`Broker::stream_shape`] describes them, by name.
    pub fn stream_shapes(
        &self,
        tenant: &str,
        namespace: &str,
    ) -> Result<Vec<StreamShape>, ErrorBody> {
        let reg = self.registry.borrow();
        require_namespace(&reg, tenant, namespace)?;
        let mut out: Vec<StreamShape> = reg
            .streams
            .values()
            .filter(|s| s.tenant == tenant && s.namespace == namespace)
            .map(|s| StreamShape {
                name: s.name.clone(),
                shards: s.settings.shards,
                durable: s.settings.durability == Durability::Durable,
                version: s.version,
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// A durable shard's tiers; an ephemeral shard has no history to read.
    fn durable_tier(
        &self,
        tenant: &str,
        namespace: &str,
        stream: &str,
        shard_no: u32,
    ) -> Result<(Arc<Shard>, Arc<TieredShard>), ErrorBody> {
        let (shard, _) = self.shard(tenant, namespace, stream, shard_no)?;
        let tier = shard.tier.clone().ok_or_else(|| {
            err(
                codes::INVALID_ARGUMENT,
                "ephemeral_stream",
                format!(
                    "stream {tenant}/{namespace}/{stream} is ephemeral: it keeps no log to read \
                     by offset"
                ),
            )
        })?;
        Ok((shard, tier))
    }

    /// A durable shard's earliest readable offset (either tier) and its high watermark (the
    /// offset the next committed record will take; readers see everything below it).
    pub fn shard_bounds(
        &self,
        tenant: &str,
        namespace: &str,
        stream: &str,
        shard_no: u32,
    ) -> Result<ShardBounds, ErrorBody> {
        let (shard, tier) = self.durable_tier(tenant, namespace, stream, shard_no)?;
        Ok(ShardBounds {
            earliest: tier.earliest_offset(),
            high_watermark: shard.visible_end(),
        })
    }

    /// Changes whenever a durable shard's high watermark may have moved: what a pull reader
    /// waiting for new records watches.
    pub fn watch_high_watermark(
        &self,
        tenant: &str,
        namespace: &str,
        stream: &str,
        shard_no: u32,
    ) -> Result<watch::Receiver<u64>, ErrorBody> {
        let (shard, tier) = self.durable_tier(tenant, namespace, stream, shard_no)?;
        Ok(shard
            .watch_visible()
            .unwrap_or_else(|| tier.log.watch_committed()))
    }

    /// A pull read of one durable shard, as a Kafka fetch makes it: whole stored batches
    /// starting with the one holding `offset`, up to about `max_bytes` (at least one batch
    /// if any is readable), from whichever tier holds them, never past the high watermark.
    /// An offset below the earliest is `offset_too_old`; one past the high watermark is
    /// `offset_out_of_range`; one at it reads nothing.
    pub async fn fetch(
        &self,
        tenant: &str,
        namespace: &str,
        stream: &str,
        shard_no: u32,
        offset: u64,
        max_bytes: usize,
    ) -> Result<ShardRead, ErrorBody> {
        let (shard, tier) = self.durable_tier(tenant, namespace, stream, shard_no)?;
        let high_watermark = shard.visible_end();
        let earliest = tier.earliest_offset();
        if offset < earliest {
            return Err(cold_error(&ColdError::TooOld {
                requested: offset,
                earliest,
            }));
        }
        if offset > high_watermark {
            return Err(err(
                codes::OFFSET_OUT_OF_RANGE,
                "offset_out_of_range",
                format!("offset {offset} is outside [{earliest}, {high_watermark}] on this shard"),
            ));
        }
        let mut pos = offset;
        while pos < high_watermark {
            match tier.read(pos, max_bytes.max(1), Some(high_watermark)).await {
                Ok(read) if !read.batches.is_empty() => {
                    return Ok(ShardRead {
                        batches: read.batches,
                        next_offset: read.next_offset,
                        earliest,
                        high_watermark,
                    });
                }
                // The rest of an object is empty below the bound: continue after it.
                Ok(read) if read.tier == Tier::Cold => {
                    pos = read.next_offset.max(pos + 1).min(high_watermark);
                }
                // No whole batch below the bound from here: a gap up to it.
                Ok(_) => pos = high_watermark,
                Err(e) => return Err(cold_error(&e)),
            }
        }
        Ok(ShardRead {
            batches: Bytes::new(),
            next_offset: pos,
            earliest,
            high_watermark,
        })
    }

    /// The base offset of the first batch of a durable shard holding a record stamped at or
    /// after `timestamp_ms`, searching both tiers; `None` if no committed record is that new.
    pub async fn offset_for_time(
        &self,
        tenant: &str,
        namespace: &str,
        stream: &str,
        shard_no: u32,
        timestamp_ms: i64,
    ) -> Result<Option<u64>, ErrorBody> {
        let (shard, tier) = self.durable_tier(tenant, namespace, stream, shard_no)?;
        let found = tier
            .offset_for_time(timestamp_ms)
            .await
            .map_err(|e| cold_error(&e))?;
        Ok(found.filter(|o| *o < shard.visible_end()))
    }

    /// Allocates an idempotent producer id from the control plane.
    pub async fn producer_init(&self) -> Result<(i64, i16), ErrorBody> {
        match self
            .propose(Command::AllocateProducerIds { count: 1 })
            .await?
        {
            Applied::ProducerIds { first, .. } => Ok((first, 0)),
            other => Err(err(
                codes::INTERNAL,
                "internal",
                format!("unexpected answer {other:?}"),
            )),
        }
    }

    // --- cluster mode -------------------------------------------------------------------

    /// In a cluster, a tenant, namespace or stream another broker just created may not be
    /// applied here yet: on such a refusal, catch up with the control plane (a linearizable
    /// read) and say whether to try again.
    async fn catch_up_if_unknown(&self, e: &ErrorBody) -> bool {
        let unknown = matches!(
            e.code,
            codes::UNKNOWN_TENANT | codes::UNKNOWN_NAMESPACE | codes::UNKNOWN_STREAM
        );
        self.cluster && unknown && self.meta.read(|_| ()).await.is_ok()
    }

    /// This broker's shard-leader lease.
    pub(crate) fn lease(&self) -> &Lease {
        &self.lease
    }

    pub(crate) fn meta(&self) -> &MetaHandle {
        &self.meta
    }

    /// The internal HTTP client to other brokers.
    pub(crate) fn peers(&self) -> &crate::replication::ReplClient {
        &self.peers
    }

    /// Whether this node is one broker of a cluster.
    pub fn is_cluster(&self) -> bool {
        self.cluster
    }

    /// Whether the shard's stream is a Quorum stream now.
    pub(crate) fn is_quorum(&self, key: &ShardKey) -> bool {
        self.registry
            .borrow()
            .streams
            .get(&felix_meta::model::stream_key(
                &key.tenant,
                &key.namespace,
                &key.stream,
            ))
            .is_some_and(|s| s.settings.consistency == Consistency::Quorum)
    }

    /// Whether the applied placement still names this broker leader at `generation`.
    pub(crate) fn is_leader_at(&self, key: &ShardKey, generation: u64) -> bool {
        self.meta.local(|s| {
            s.placements.get(key).is_some_and(|p| {
                p.leader == Some(self.config.node_id) && p.generation == generation
            })
        })
    }

    /// Whether the control plane counts a broker alive.
    pub(crate) fn is_alive(&self, id: u64) -> bool {
        self.registry
            .borrow()
            .brokers
            .get(&id)
            .is_some_and(|b| b.alive)
    }

    /// A broker's internal address (replication, Raft).
    pub(crate) fn internal_addr_of(&self, id: u64) -> Option<String> {
        self.registry
            .borrow()
            .brokers
            .get(&id)
            .map(|b| b.internal_addr.clone())
    }

    /// A shard's local state by key, for the replication endpoint.
    pub(crate) fn open_replica(&self, key: &ShardKey) -> Result<Arc<Shard>, ErrorBody> {
        self.local_shard(&key.tenant, &key.namespace, &key.stream, key.shard)
            .map(|(s, _)| s)
    }

    /// Reloads a shard's manifest from the control plane (a new leader's copy may be stale:
    /// the previous leader recorded objects since this broker opened the shard).
    pub(crate) fn refresh_manifest(&self, shard: &Shard) {
        if let Some(tier) = &shard.tier {
            refresh_manifest(tier, &self.meta);
        }
    }

    /// Who leads each shard of a stream, and the cluster's brokers: a cluster client's
    /// routing table. On a single node, this node leads every shard.
    pub fn topology(
        &self,
        tenant: &str,
        namespace: &str,
        name: &str,
    ) -> Result<(Vec<ShardRoute>, Vec<BrokerRoute>), ErrorBody> {
        let (_, settings) = self.stream_settings(tenant, namespace, name)?;
        let reg = self.registry.borrow();
        let me = self.config.node_id;
        let my_addr = reg
            .brokers
            .get(&me)
            .map(|b| b.client_addr.clone())
            .unwrap_or_else(|| self.config.quic_addr.to_string());
        let shards = (0..settings.shards)
            .map(|k| {
                let key = ShardKey {
                    tenant: tenant.to_owned(),
                    namespace: namespace.to_owned(),
                    stream: name.to_owned(),
                    shard: k,
                };
                match reg.placements.get(&key) {
                    Some(p) if self.cluster => ShardRoute {
                        shard: k,
                        leader: p.leader,
                        leader_addr: p
                            .leader
                            .and_then(|l| reg.brokers.get(&l))
                            .map(|b| b.client_addr.clone()),
                        generation: p.generation,
                        replicas: p.replicas.clone(),
                    },
                    // Every stream of a single node is served by the broker a client talks to.
                    _ if !self.cluster => ShardRoute {
                        shard: k,
                        leader: Some(me),
                        leader_addr: Some(my_addr.clone()),
                        generation: 0,
                        replicas: vec![me],
                    },
                    _ => ShardRoute {
                        shard: k,
                        leader: None,
                        leader_addr: None,
                        generation: 0,
                        replicas: Vec::new(),
                    },
                }
            })
            .collect();
        let mut brokers: Vec<BrokerRoute> = reg
            .brokers
            .values()
            .map(|b| BrokerRoute {
                id: b.id,
                client_addr: b.client_addr.clone(),
                alive: b.alive,
            })
            .collect();
        if brokers.is_empty() {
            brokers.push(BrokerRoute {
                id: me,
                client_addr: my_addr,
                alive: true,
            });
        }
        Ok((shards, brokers))
    }

    /// In a cluster, each shard's leader, generation, replicas and the replicas known to
    /// hold everything committed (Kafka's ISR); `None` on a single node.
    pub fn partition_routes(
        &self,
        tenant: &str,
        namespace: &str,
        name: &str,
        shards: u32,
    ) -> Option<Vec<PartitionRoute>> {
        if !self.cluster {
            return None;
        }
        let reg = self.registry.borrow();
        let routes = (0..shards)
            .map(|k| {
                let key = ShardKey {
                    tenant: tenant.to_owned(),
                    namespace: namespace.to_owned(),
                    stream: name.to_owned(),
                    shard: k,
                };
                let Some(p) = reg.placements.get(&key) else {
                    return PartitionRoute::default();
                };
                let in_sync = self
                    .meta
                    .replication(&key)
                    .filter(|r| r.generation == p.generation)
                    .map(|r| r.in_sync.into_iter().collect())
                    .unwrap_or_else(|| p.replicas.clone());
                PartitionRoute {
                    leader: p
                        .leader
                        .filter(|l| reg.brokers.get(l).is_some_and(|b| b.alive)),
                    generation: p.generation,
                    replicas: p.replicas.clone(),
                    in_sync,
                }
            })
            .collect();
        Some(routes)
    }

    /// In a cluster, every registered broker's id, Kafka address and liveness; `None` on a
    /// single node.
    pub fn kafka_brokers(&self) -> Option<Vec<(u64, Option<String>, bool)>> {
        if !self.cluster {
            return None;
        }
        Some(
            self.registry
                .borrow()
                .brokers
                .values()
                .map(|b| (b.id, b.kafka_addr.clone(), b.alive))
                .collect(),
        )
    }

    /// Stops accepting publishes, ends subscriptions and flushes every durable shard.
    pub async fn shutdown(&self) {
        self.stopping.store(true, Ordering::Release);
        let shards: Vec<Arc<Shard>> = self.shards.lock().drain().map(|(_, s)| s).collect();
        for s in &shards {
            s.closed.store(true, Ordering::Release);
            let _ = s.stop_tasks.send(true);
            s.fanout.inner.lock().subscribers.clear();
            if let Some(log) = &s.log
                && let Err(e) = log.sync().await
            {
                warn!(shard = %s.key, error = %e, "final flush failed");
            }
        }
    }
}

/// The object-key prefix of a stream's objects.
/// A durable shard's offsets and tier sizes.
fn shard_info(k: u32, tier: &TieredShard) -> ShardInfo {
    let m = tier.manifest.snapshot();
    let uploaded_end = m.uploaded_end();
    let (backlog_n, backlog_bytes) = upload_backlog(&tier.log, uploaded_end);
    ShardInfo {
        shard: k,
        first_offset: tier.earliest_offset(),
        next_offset: tier.log.committed_offset(),
        hot_first_offset: tier.log.first_offset(),
        hot_bytes: tier.log.size_bytes(),
        cold_bytes: m.cold_bytes(),
        uploaded_end,
        upload_backlog_segments: backlog_n,
        upload_backlog_bytes: backlog_bytes,
    }
}

/// A durable shard's objects, then its local segments not covered by them.
fn segment_infos(k: u32, tier: &TieredShard) -> Vec<SegmentInfo> {
    let m = tier.manifest.snapshot();
    let hot_first = tier.log.first_offset();
    let uploaded_end = m.uploaded_end();
    let mut out: Vec<SegmentInfo> = m
        .objects
        .values()
        .map(|e| SegmentInfo {
            shard: k,
            base_offset: e.base_offset,
            last_offset: e.last_offset,
            min_timestamp: e.min_timestamp,
            max_timestamp: e.max_timestamp,
            size_bytes: e.size_bytes,
            tier: "cold".into(),
            object_key: e.object_key.clone(),
            local: e.last_offset >= hot_first,
        })
        .collect();
    let sealed = tier.log.sealed_segments();
    let mut first_pending = true;
    for s in &sealed {
        if s.last_offset < uploaded_end {
            continue;
        }
        out.push(SegmentInfo {
            shard: k,
            base_offset: s.base_offset.max(uploaded_end),
            last_offset: s.last_offset,
            min_timestamp: s.min_timestamp,
            max_timestamp: s.max_timestamp,
            size_bytes: s.size_bytes,
            tier: if first_pending { "uploading" } else { "hot" }.into(),
            object_key: None,
            local: true,
        });
        first_pending = false;
    }
    let offsets = tier.log.offsets();
    let active_base = out
        .last()
        .map_or(hot_first.max(uploaded_end), |s| s.last_offset + 1);
    if offsets.committed > active_base {
        out.push(SegmentInfo {
            shard: k,
            base_offset: active_base,
            last_offset: offsets.committed - 1,
            min_timestamp: 0,
            max_timestamp: 0,
            size_bytes: tier
                .log
                .size_bytes()
                .saturating_sub(sealed.iter().map(|s| s.size_bytes).sum()),
            tier: "hot".into(),
            object_key: None,
            local: true,
        });
    }
    out
}

/// Probes the object store at startup and every 30 s after, so an unreachable store is
/// said plainly in the log and in `felix_tier_store_up`.
async fn probe_object_store(store: TierStore, metrics: Arc<Metrics>) {
    let mut was_up = None;
    loop {
        let up = match store.check().await {
            Ok(()) => true,
            Err(e) => {
                if was_up != Some(false) {
                    warn!(store = store.description(), error = %e,
                        "object store unreachable: uploads wait (sealed segments stay local) and \
                         history older than the local log cannot be read until it returns");
                }
                false
            }
        };
        if up && was_up == Some(false) {
            info!(store = store.description(), "object store reachable again");
        }
        metrics.tier_store_up.set(i64::from(up));
        was_up = Some(up);
        tokio::time::sleep(Duration::from_secs(if up { 30 } else { 5 })).await;
    }
}

/// Closes every open shard of a stream (its tasks stop, its subscribers end) and forgets
/// them; their files stay until the caller removes them.
fn retire_stream(
    shards: &mut HashMap<ShardKey, Arc<Shard>>,
    tenant: &str,
    namespace: &str,
    name: &str,
) {
    let of_stream = |k: &ShardKey, _: &mut Arc<Shard>| {
        k.tenant == tenant && k.namespace == namespace && k.stream == name
    };
    for (_, s) in shards.extract_if(of_stream) {
        s.closed.store(true, Ordering::Release);
        let _ = s.stop_tasks.send(true);
        s.fanout.inner.lock().subscribers.clear();
    }
}

/// Acts on deletes this broker did not handle itself (it is a follower of the stream, or
/// the delete came through another broker or straight to the control plane): once a stream
/// is gone from the registry, its open shards close and its files go. A stream created
/// again under the same name meanwhile is another incarnation; [`Broker::local_shard`]
/// retires the old shards when it opens the new one.
async fn watch_deletes(broker: std::sync::Weak<Broker>) {
    let mut registry = match broker.upgrade() {
        Some(b) => b.registry.clone(),
        None => return,
    };
    loop {
        let reg = registry.borrow_and_update().clone();
        {
            let Some(b) = broker.upgrade() else { return };
            let gone: BTreeSet<(String, String, String)> = b
                .shards
                .lock()
                .keys()
                .filter(|k| reg.stream(&k.tenant, &k.namespace, &k.stream).is_none())
                .map(|k| (k.tenant.clone(), k.namespace.clone(), k.stream.clone()))
                .collect();
            for (t, n, s) in gone {
                retire_stream(&mut b.shards.lock(), &t, &n, &s);
                let dir = b.stream_dir(&t, &n, &s);
                match std::fs::remove_dir_all(&dir) {
                    Ok(()) => info!(
                        stream = format!("{t}/{n}/{s}"),
                        "removed a deleted stream's files"
                    ),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => {
                        warn!(dir = %dir.display(), error = %e, "could not remove a deleted stream's files")
                    }
                }
            }
        }
        if registry.changed().await.is_err() {
            return;
        }
    }
}

/// Opens every durable shard once the registry is loaded, so uploads and retention resume
/// after a restart without waiting for a client to touch each stream. First removes the
/// files of streams deleted while this broker was down or mid-delete: judged on a
/// linearizable read, so a stream this broker has not heard of yet is never taken for one.
async fn open_durable_shards(broker: std::sync::Weak<Broker>) {
    loop {
        let Some(b) = broker.upgrade() else { return };
        if b.meta.is_ready() {
            match b.meta.read(crate::stream_files::LiveStreams::of).await {
                Ok(live) => {
                    let root = b.config.data_dir.join("streams");
                    crate::stream_files::sweep(&root, &live);
                }
                Err(e) => {
                    warn!(error = %e, "no linearizable read of the streams; deleted streams' files stay until the next start")
                }
            }
            let streams: Vec<(String, String, String)> = b
                .registry
                .borrow()
                .streams
                .values()
                .filter(|s| s.settings.durability == Durability::Durable)
                .map(|s| (s.tenant.clone(), s.namespace.clone(), s.name.clone()))
                .collect();
            for (t, n, s) in streams {
                if let Err(e) = b.open_shards(&t, &n, &s) {
                    warn!(stream = format!("{t}/{n}/{s}"), error = %e.message, "could not open a stream's shards");
                }
            }
            return;
        }
        drop(b);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Cluster mode: hands every placement that names this broker to its shard (opening the
/// shard if needed), so each shard's driver takes the role the control plane gives it.
async fn watch_placements(broker: std::sync::Weak<Broker>) {
    let mut registry = match broker.upgrade() {
        Some(b) => b.registry.clone(),
        None => return,
    };
    loop {
        let placements = registry.borrow_and_update().placements.clone();
        {
            let Some(b) = broker.upgrade() else { return };
            if b.stopping.load(Ordering::Acquire) {
                return;
            }
            let me = b.config.node_id;
            for (key, p) in placements {
                if !p.replicas.contains(&me) {
                    // Not (or no longer) a replica: a shard still open here stops serving.
                    let open = b.shards.lock().get(&key).cloned();
                    if let Some(r) = open.as_ref().and_then(|s| s.repl.as_ref()) {
                        r.set_placement(&p);
                    }
                    continue;
                }
                match b.local_shard(&key.tenant, &key.namespace, &key.stream, key.shard) {
                    Ok((s, _)) => {
                        if let Some(r) = &s.repl {
                            r.set_placement(&p);
                        }
                    }
                    Err(e) => {
                        warn!(shard = %key, error = %e.message, "cannot open a placed shard")
                    }
                }
            }
        }
        if registry.changed().await.is_err() {
            return;
        }
    }
}

/// Applies a shard's retention settings every `every`, until stopped.
async fn run_retention(
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
            Some(r) if r.leading().is_some() => *r.visible.borrow(),
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
fn refresh_manifest(tier: &TieredShard, meta: &MetaHandle) {
    let state = meta.local(|s| ManifestState::of(s, &tier.key));
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

/// Follows a durable shard's log: offers every committed batch, in offset order, to the
/// shard's live subscribers.
async fn follow_log(
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
        let cursor = fanout.inner.lock().cursor;
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
            let mut inner = fanout.inner.lock();
            inner.cursor = inner.cursor.max(read.next_offset);
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
        let mut inner = fanout.inner.lock();
        inner.cursor = inner.cursor.max(read.next_offset);
    }
}

/// Keeps the shard's idempotent-producer snapshot in step with sealed segments.
async fn snapshot_producers_at_seal(
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
