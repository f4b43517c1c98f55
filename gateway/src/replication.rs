//! Cluster mode: who leads each shard, log shipping from leaders to followers, the quorum
//! mark and the broker's lease.
//!
//! A follower pulls: it asks its shard's leader for the batches after the end of its own
//! log (`POST /repl/fetch` on the leader's internal address), appends them unchanged, with
//! their offsets and generation, under its own fsync policy, and asks again. The offset it
//! asks from is also its report: it holds everything below it. The leader's replication
//! driver turns those reports into the quorum mark (the highest offset a majority holds),
//! records the mark and the replicas that hold it in the control plane
//! (`ReportReplicas`), and only then releases it to the publishes waiting for Quorum
//! acknowledgements and to readers. A report is refused once a newer generation exists,
//! so a deposed leader can never acknowledge a Quorum write.
//!
//! When the control plane names a new leader (generation g), it records where generation g
//! starts: the committed mark. The new leader cuts its log there before it serves. A
//! follower that held records of an older generation e cuts its log at the end of e as the
//! control plane recorded it, so records no majority held are dropped everywhere.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use bytes::Bytes;
use felix_meta::model::{Placement, ShardKey};
use felix_meta::{Command, CommandError, MetaError, MetaHandle};
use http_body_util::{BodyExt, Full};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tokio::sync::{Notify, watch};
use tracing::{debug, info, warn};

use felix_wire::protocol::{ErrorBody, codes};

use crate::broker::{Broker, Shard};

/// The role this broker has for one shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    /// No placement names this broker's part yet.
    Unplaced,
    /// Leading at this generation, after cutting the log to the generation's start.
    Leader { generation: u64 },
    /// Following `leader` at this generation.
    Follower { leader: u64, generation: u64 },
    /// Named leader but without a valid lease: refuses writes and reads until it has one.
    Fenced { generation: u64 },
    /// Named leader but unable to lead (its log lacks committed records).
    Unavailable { generation: u64, why: String },
}

/// A shard's replication state on this broker (cluster mode only).
pub struct ReplState {
    pub role: watch::Sender<Role>,
    /// The end of what readers may see: the released quorum mark on a Quorum stream, the
    /// committed end of the log on a Leader stream (while leading).
    pub visible: watch::Sender<u64>,
    /// The newest placement this broker has seen for the shard.
    pub placement: watch::Sender<Option<Placement>>,
    /// Followers' reported ends at the current generation.
    followers: Mutex<HashMap<u64, u64>>,
    /// Wakes the leader's driver when a follower reported progress.
    progress: Notify,
}

impl ReplState {
    pub fn new(visible: u64) -> ReplState {
        ReplState {
            role: watch::channel(Role::Unplaced).0,
            visible: watch::channel(visible).0,
            placement: watch::channel(None).0,
            followers: Mutex::new(HashMap::new()),
            progress: Notify::new(),
        }
    }

    /// Hands the shard a placement from the registry (its driver wakes only on a change).
    pub fn set_placement(&self, p: &Placement) {
        self.placement.send_if_modified(|old| {
            let changed = old.as_ref() != Some(p);
            *old = Some(p.clone());
            changed
        });
    }

    /// Raises the read bound to `end` (it never goes down while a role lasts).
    fn raise_visible(&self, end: u64) {
        self.visible.send_if_modified(|v| {
            let moved = end > *v;
            *v = (*v).max(end);
            moved
        });
    }

    /// The generation this broker leads at, if it leads.
    pub fn leading(&self) -> Option<u64> {
        match &*self.role.borrow() {
            Role::Leader { generation } => Some(*generation),
            _ => None,
        }
    }
}

/// The broker's shard-leader lease, as this broker counts it: from the instant it sent the
/// renewal that the control plane granted, so it ends no later than the control plane's view.
pub struct Lease {
    base: Instant,
    /// Nanoseconds after `base` until which the lease holds; 0: never granted.
    until: AtomicU64,
}

impl Default for Lease {
    fn default() -> Self {
        Lease {
            base: Instant::now(),
            until: AtomicU64::new(0),
        }
    }
}

impl Lease {
    pub fn holds(&self) -> bool {
        let now = self.base.elapsed().as_nanos() as u64;
        now < self.until.load(Ordering::Acquire)
    }

    /// How long the lease still holds (zero once it lapsed).
    pub fn remaining(&self) -> Duration {
        let now = self.base.elapsed().as_nanos() as u64;
        Duration::from_nanos(self.until.load(Ordering::Acquire).saturating_sub(now))
    }

    fn extend(&self, sent: Instant, granted: Duration) {
        let until = (sent.saturating_duration_since(self.base) + granted).as_nanos() as u64;
        self.until.fetch_max(until, Ordering::AcqRel);
    }
}

/// Renews the broker's lease every quarter of its duration, until the broker is gone.
pub async fn keep_lease(meta: MetaHandle, broker_id: u64, lease: Arc<Lease>, every: Duration) {
    let mut failing = false;
    loop {
        let sent = Instant::now();
        match meta.renew_broker_lease(broker_id).await {
            Ok(granted) => {
                lease.extend(sent, granted);
                if failing {
                    info!("shard-leader lease renewed again");
                }
                failing = false;
            }
            Err(e) => {
                if !failing {
                    warn!(error = %e, "cannot renew the shard-leader lease; this broker stops \
                        acknowledging writes when it lapses");
                }
                failing = true;
            }
        }
        if Arc::strong_count(&lease) == 1 {
            return;
        }
        tokio::time::sleep(every).await;
    }
}

/// The majority mark of a replica set and the replicas that hold it: `ends` holds every
/// replica's end that is known (the leader's included); unknown replicas hold nothing.
pub fn quorum_mark(
    replicas: &[u64],
    ends: &HashMap<u64, u64>,
    floor: u64,
) -> (u64, std::collections::BTreeSet<u64>) {
    let mut known: Vec<u64> = replicas
        .iter()
        .map(|r| ends.get(r).copied().unwrap_or(0))
        .collect();
    known.sort_unstable_by(|a, b| b.cmp(a));
    let majority = replicas.len() / 2 + 1;
    let mark = known
        .get(majority.saturating_sub(1))
        .copied()
        .unwrap_or(0)
        .max(floor);
    let in_sync = replicas
        .iter()
        .copied()
        .filter(|r| ends.get(r).copied().unwrap_or(0) >= mark)
        .collect();
    (mark, in_sync)
}

// ---------------------------------------------------------------------------------------
// The shard's driver: follows placement changes and acts on them.

/// Runs for one durable shard in cluster mode, until the shard closes: takes the role the
/// placement gives this broker, leads (mark, reports, lease) or follows (fetch loop).
pub async fn drive_shard(broker: Weak<Broker>, shard: Arc<Shard>) {
    let Some(repl) = shard.repl.clone() else {
        return;
    };
    let mut placements = repl.placement.subscribe();
    // The leader's or the follower's loop, whichever role this broker has.
    let mut task: Option<tokio::task::JoinHandle<()>> = None;
    loop {
        if shard.is_closed() {
            break;
        }
        let Some(b) = broker.upgrade() else { break };
        let me = b.broker_id();
        let placement = placements.borrow_and_update().clone();
        let current = repl.role.borrow().clone();
        let wanted = match &placement {
            None => Role::Unplaced,
            Some(p) if p.leader == Some(me) => Role::Leader {
                generation: p.generation,
            },
            Some(p) => match p.leader {
                Some(leader) if p.replicas.contains(&me) => Role::Follower {
                    leader,
                    generation: p.generation,
                },
                _ => Role::Unplaced,
            },
        };
        let same = match (&current, &wanted) {
            (
                Role::Leader { generation: a }
                | Role::Fenced { generation: a }
                | Role::Unavailable { generation: a, .. },
                Role::Leader { generation: b },
            ) => a == b,
            (a, b) => a == b,
        };
        if !same {
            if let Some(t) = task.take() {
                t.abort();
            }
            // Whatever this broker served under its old role ends here.
            shard.end_subscribers();
            match (&wanted, placement) {
                (Role::Leader { generation }, Some(p)) => {
                    match become_leader(&b, &shard, &repl, &p).await {
                        Ok(()) => {
                            info!(shard = %shard.key, generation, "leading");
                            task = Some(tokio::spawn(lead(
                                broker.clone(),
                                shard.clone(),
                                *generation,
                                p.replicas.clone(),
                            )));
                        }
                        Err(why) => {
                            warn!(shard = %shard.key, generation, why, "cannot lead");
                            repl.role.send_replace(Role::Unavailable {
                                generation: *generation,
                                why,
                            });
                            hand_over(&b, &shard.key, &p).await;
                        }
                    }
                }
                (Role::Follower { leader, generation }, Some(p)) => {
                    info!(shard = %shard.key, leader, generation, "following");
                    repl.role.send_replace(wanted.clone());
                    task = Some(tokio::spawn(follow(
                        broker.clone(),
                        shard.clone(),
                        *leader,
                        *generation,
                        p,
                    )));
                }
                _ => {
                    repl.role.send_replace(Role::Unplaced);
                }
            }
        }
        drop(b);
        if placements.changed().await.is_err() {
            break;
        }
    }
    if let Some(t) = task {
        t.abort();
    }
}

/// A broker that cannot lead a Quorum shard it was given (its log lacks committed records)
/// hands the shard to a live replica that holds everything committed; the control plane
/// checks that choice again. A Leader shard has no such replica to trust: it stays
/// unavailable until an operator intervenes.
async fn hand_over(broker: &Broker, key: &ShardKey, p: &Placement) {
    if !broker.is_quorum(key) {
        return;
    }
    let Some(replication) = broker.meta().replication(key) else {
        return;
    };
    let me = broker.broker_id();
    let Some(successor) = p
        .replicas
        .iter()
        .copied()
        .find(|r| *r != me && replication.in_sync.contains(r) && broker.is_alive(*r))
    else {
        warn!(shard = %key, "no live in-sync replica to hand the shard to; it stays unavailable");
        return;
    };
    let cmd = Command::SetPlacement {
        shard: key.clone(),
        replicas: p.replicas.clone(),
        leader: Some(successor),
    };
    match broker.meta().propose(cmd).await {
        Ok(_) => info!(shard = %key, successor, "handed the shard to an in-sync replica"),
        Err(e) => warn!(shard = %key, successor, error = %e, "could not hand the shard over"),
    }
}

/// Takes leadership at `p.generation`: cuts the log at the generation's start (records past
/// the committed mark were never acknowledged), adopts the generation, rebuilds the
/// producer table and the read bound.
async fn become_leader(
    broker: &Broker,
    shard: &Shard,
    repl: &ReplState,
    p: &Placement,
) -> Result<(), String> {
    let log = shard.log.as_ref().ok_or("not a durable shard")?;
    let start = p.epoch_start(p.generation).unwrap_or(0);
    let next = log.next_offset();
    // Leading again at the generation the log already has (a restart): everything in it
    // was written by this leader in this generation or earlier and kept; nothing to cut.
    let same_generation = log.generation() >= 0 && log.generation() as u64 >= p.generation;
    // What readers may see from the start: everything committed, nothing above it yet.
    let visible = if same_generation {
        let quorum = broker.is_quorum(&shard.key);
        let committed = broker
            .meta()
            .replication(&shard.key)
            .filter(|r| r.generation == p.generation)
            .map_or(start, |r| r.committed);
        if quorum && next < committed {
            return Err(format!(
                "the local log ends at {next}, below the committed mark {committed} (records \
                 lost since they were acknowledged, e.g. by a machine crash)"
            ));
        }
        if quorum {
            committed.max(start)
        } else {
            log.committed_offset()
        }
    } else {
        if next < start {
            // It lost records the control plane counts as committed (a machine crash under a
            // periodic fsync policy): it must not lead, or it would hand their offsets out
            // again.
            return Err(format!(
                "the local log ends at {next}, below the committed mark {start}; \
                 it cannot lead without those records"
            ));
        }
        if next > start {
            log.truncate_to(start)
                .await
                .map_err(|e| format!("cut the log at {start}: {e}"))?;
            warn!(shard = %shard.key, from = start, to = next,
                "dropped records past the committed mark before leading");
        }
        shard.reset_after_truncation().await?;
        start
    };
    log.set_generation(p.generation as i32)
        .map_err(|e| e.to_string())?;
    repl.followers.lock().clear();
    repl.visible.send_replace(visible);
    shard.reset_fanout(visible);
    broker.refresh_manifest(shard);
    repl.role.send_replace(Role::Leader {
        generation: p.generation,
    });
    Ok(())
}

/// The leader's loop: advances the read bound (Leader stream) or the quorum mark (Quorum
/// stream, reported to the control plane before it is released), and fences the shard while
/// the lease has lapsed.
async fn lead(broker: Weak<Broker>, shard: Arc<Shard>, generation: u64, replicas: Vec<u64>) {
    let Some(repl) = shard.repl.clone() else {
        return;
    };
    let Some(log) = shard.log.clone() else {
        return;
    };
    let mut committed = log.watch_committed();
    let floor = *repl.visible.borrow();
    // Set once the control plane refused a report for a newer generation: this broker was
    // replaced and must not take the role back when its lease renews.
    let mut deposed = false;
    loop {
        let Some(b) = broker.upgrade() else { return };
        if shard.is_closed() {
            return;
        }
        // The lease: without it another broker may lead by now.
        let holds = b.lease().holds();
        let role = repl.role.borrow().clone();
        // Each flip is made only from the exact role this task set, checked atomically:
        // the shard's driver may have moved the role on (and aborted this task) meanwhile.
        let fence = Role::Fenced { generation };
        let lead = Role::Leader { generation };
        match (&role, holds) {
            (Role::Leader { .. }, false) if swap_role(&repl, &lead, &fence) => {
                warn!(shard = %shard.key, generation, "lease lapsed: fenced");
                shard.end_subscribers();
            }
            (Role::Fenced { .. }, true) if !deposed => {
                // Writes refused while the lease was out (`enqueue_ack`) may have left
                // idempotent producers' sequences past the log: take them from the log.
                if let Err(e) = shard.reset_after_truncation().await {
                    warn!(shard = %shard.key, error = %e, "cannot rebuild producer sequences");
                } else if swap_role(&repl, &fence, &lead) {
                    info!(shard = %shard.key, generation, "lease renewed: leading again");
                }
            }
            _ => {}
        }
        if matches!(&*repl.role.borrow(), Role::Leader { .. }) {
            let end = log.committed_offset();
            if b.is_quorum(&shard.key) {
                let mut ends = repl.followers.lock().clone();
                ends.insert(b.broker_id(), end);
                let (mark, in_sync) = quorum_mark(&replicas, &ends, floor);
                if mark > *repl.visible.borrow() {
                    let cmd = Command::ReportReplicas {
                        shard: shard.key.clone(),
                        generation,
                        committed: mark,
                        in_sync,
                    };
                    match b.meta().propose(cmd).await {
                        Ok(_) => {
                            // Re-check the lease after the report landed: the ack must
                            // not go out from a broker that may have been replaced.
                            if b.lease().holds()
                                && repl.leading() == Some(generation)
                                && b.is_leader_at(&shard.key, generation)
                            {
                                repl.raise_visible(mark);
                            }
                            continue;
                        }
                        Err(MetaError::Rejected(CommandError::StaleGeneration { .. })) => {
                            deposed = true;
                            if swap_role(&repl, &lead, &fence) {
                                warn!(shard = %shard.key, generation,
                                    "a newer generation exists: no longer leading");
                                shard.end_subscribers();
                            }
                        }
                        Err(e) => {
                            debug!(shard = %shard.key, error = %e, "replication report failed; retrying");
                            drop(b);
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            continue;
                        }
                    }
                }
            } else {
                repl.raise_visible(end);
            }
        }
        drop(b);
        tokio::select! {
            _ = committed.changed() => {}
            _ = repl.progress.notified() => {}
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
    }
}

/// Sets the role to `to` if it is `from`; says whether it did.
fn swap_role(repl: &ReplState, from: &Role, to: &Role) -> bool {
    repl.role.send_if_modified(|role| {
        if role == from {
            *role = to.clone();
            true
        } else {
            false
        }
    })
}

// ---------------------------------------------------------------------------------------
// Following.

/// A follower's loop: cut what diverges from the leader's history, then fetch and append.
async fn follow(
    broker: Weak<Broker>,
    shard: Arc<Shard>,
    leader: u64,
    generation: u64,
    placement: Placement,
) {
    let Some(log) = shard.log.clone() else {
        return;
    };
    let Some(repl) = shard.repl.clone() else {
        return;
    };
    // Records of an older generation past that generation's end were never committed.
    let mine = log.generation();
    if mine >= 0
        && (mine as u64) < generation
        && let Some(end) = placement.epoch_end(mine as u64)
        && log.next_offset() > end
    {
        let next = log.next_offset();
        match log.truncate_to(end).await {
            Ok(_) => {
                warn!(shard = %shard.key, from = end, to = next, generation = mine,
                    "dropped records of an older generation that were never committed");
                if let Err(e) = shard.reset_after_truncation().await {
                    warn!(shard = %shard.key, error = e, "rebuilding producer state failed");
                }
            }
            Err(e) => {
                warn!(shard = %shard.key, error = %e, "cannot cut the diverging records; not following");
                return;
            }
        }
    }
    let mut backoff = Duration::from_millis(50);
    loop {
        if repl.role.borrow().clone() != (Role::Follower { leader, generation }) {
            return;
        }
        let Some(b) = broker.upgrade() else { return };
        let Some(addr) = b.internal_addr_of(leader) else {
            drop(b);
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        };
        let me = b.broker_id();
        let client = b.peers().clone();
        drop(b);
        let from = log.next_offset();
        let req = FetchRequest {
            shard: shard.key.clone(),
            generation,
            follower: me,
            from,
            max_bytes: 1 << 20,
            wait_ms: 500,
        };
        match client.fetch(&addr, &req).await {
            Ok(batches) if batches.is_empty() => {
                backoff = Duration::from_millis(50);
            }
            Ok(batches) => {
                backoff = Duration::from_millis(50);
                let mut last = None;
                let mut failed = false;
                for item in felix_wire::BatchIter::new(&batches, usize::MAX) {
                    let Ok((_, bytes)) = item else {
                        warn!(shard = %shard.key, "leader sent a damaged batch; fetching again");
                        failed = true;
                        break;
                    };
                    match log.append_at(bytes.to_vec()).await {
                        Ok(t) => last = Some(t),
                        Err(e) => {
                            warn!(shard = %shard.key, error = %e, "follower append refused");
                            failed = true;
                            break;
                        }
                    }
                }
                if let Some(t) = last
                    && let Err(e) = t.committed().await
                {
                    warn!(shard = %shard.key, error = %e, "follower write failed");
                    failed = true;
                }
                if failed {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
            Err(FetchError::Behind { first }) => {
                // Retention removed these records from both tiers: this copy cannot continue
                // without a gap. Wiping the shard's directory makes it start again after the
                // uploaded history (docs/replication.md).
                warn!(shard = %shard.key, from, first,
                    "this replica needs records that retention already removed; it cannot \
                     catch up (remove its shard directory to re-seed it)");
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
            Err(e) => {
                debug!(shard = %shard.key, leader, error = %e, "replication fetch failed");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// The internal endpoint and its client.

/// A follower's fetch: the batches from `from` on, waiting up to `wait_ms` for some.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FetchRequest {
    pub shard: ShardKey,
    pub generation: u64,
    pub follower: u64,
    /// The follower holds everything below this offset.
    pub from: u64,
    pub max_bytes: usize,
    pub wait_ms: u64,
}

/// Why a fetch was refused (the JSON body of a non-200 answer).
#[derive(Debug, Clone, Serialize, Deserialize, thiserror::Error)]
#[serde(tag = "error", rename_all = "snake_case")]
pub enum FetchError {
    #[error("this broker does not lead the shard at generation {generation:?}")]
    NotLeader { generation: Option<u64> },
    #[error("the requested offset is below the leader's local log, which starts at {first}")]
    Behind { first: u64 },
    #[error("the follower's log ends at {from}, past the leader's end {end}")]
    Ahead { from: u64, end: u64 },
    #[error("{0}")]
    Failed(String),
}

impl IntoResponse for FetchError {
    fn into_response(self) -> Response {
        let status = match self {
            FetchError::NotLeader { .. } => StatusCode::CONFLICT,
            FetchError::Behind { .. } => StatusCode::GONE,
            FetchError::Ahead { .. } => StatusCode::RANGE_NOT_SATISFIABLE,
            FetchError::Failed(_) => StatusCode::SERVICE_UNAVAILABLE,
        };
        (status, Json(self)).into_response()
    }
}

/// The broker behind the internal routes, set once it has started.
pub type BrokerSlot = Arc<OnceLock<Weak<Broker>>>;

/// Routes served on the internal address next to the control plane's.
pub fn router(slot: BrokerSlot) -> axum::Router {
    axum::Router::new()
        .route("/repl/fetch", post(serve_fetch))
        .route("/repl/publish", post(serve_forwarded_publish))
        .with_state(slot)
}

/// A publish forwarded by a broker that does not lead the shard (the batches are the body).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ForwardedPublish {
    pub tenant: String,
    pub namespace: String,
    pub stream: String,
    pub shard: u32,
    pub ack: felix_wire::protocol::AckMode,
}

/// The owner's answer to a forwarded publish.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum ForwardedAnswer {
    Published { base_offset: u64, last_offset: u64 },
    Done,
    Error { error: ErrorBody },
}

/// Header carrying a forwarded publish's JSON description.
const PUBLISH_HEADER: &str = "x-felix-publish";

async fn serve_forwarded_publish(
    State(slot): State<BrokerSlot>,
    headers: axum::http::HeaderMap,
    body: Bytes,
) -> Json<ForwardedAnswer> {
    let refuse = |message: String| {
        Json(ForwardedAnswer::Error {
            error: ErrorBody::new(codes::BAD_REQUEST, "bad_request", message),
        })
    };
    let Some(broker) = slot.get().and_then(Weak::upgrade) else {
        return Json(ForwardedAnswer::Error {
            error: ErrorBody::new(
                codes::SHARD_UNAVAILABLE,
                "starting",
                "the broker is starting",
            )
            .retry_after(500),
        });
    };
    let req: ForwardedPublish = match headers
        .get(PUBLISH_HEADER)
        .map(|v| serde_json::from_slice(v.as_bytes()))
    {
        Some(Ok(req)) => req,
        Some(Err(e)) => return refuse(format!("bad {PUBLISH_HEADER} header: {e}")),
        None => return refuse(format!("no {PUBLISH_HEADER} header")),
    };
    // Checked and applied here as if the client had sent it here: existence, limits,
    // backpressure, leadership. Never forwarded again.
    Json(
        match broker
            .publish_here(
                &req.tenant,
                &req.namespace,
                &req.stream,
                req.shard,
                req.ack,
                body,
            )
            .await
        {
            Ok(Some((base_offset, last_offset))) => ForwardedAnswer::Published {
                base_offset,
                last_offset,
            },
            Ok(None) => ForwardedAnswer::Done,
            Err(error) => ForwardedAnswer::Error { error },
        },
    )
}

async fn serve_fetch(
    State(slot): State<BrokerSlot>,
    Json(req): Json<FetchRequest>,
) -> Result<Bytes, FetchError> {
    let broker = slot
        .get()
        .and_then(Weak::upgrade)
        .ok_or_else(|| FetchError::Failed("the broker is starting".into()))?;
    let shard = broker
        .open_replica(&req.shard)
        .map_err(|e| FetchError::Failed(e.message))?;
    let (Some(repl), Some(log)) = (shard.repl.clone(), shard.log.clone()) else {
        return Err(FetchError::Failed("not a durable shard".into()));
    };
    let leading = match &*repl.role.borrow() {
        Role::Leader { generation } | Role::Fenced { generation } => Some(*generation),
        _ => None,
    };
    if leading != Some(req.generation) {
        return Err(FetchError::NotLeader {
            generation: leading,
        });
    }
    let first = log.first_offset();
    if req.from < first {
        // Moved to the object store already: serve the follower from there (the batches
        // rebuilt from Parquet keep offsets and generations).
        let Some(tier) = shard.tier.clone() else {
            return Err(FetchError::Behind { first });
        };
        drop(broker);
        return match tier
            .read(req.from, req.max_bytes.clamp(4096, 16 << 20), Some(first))
            .await
        {
            Ok(read) if !read.batches.is_empty() => Ok(read.batches),
            Ok(_) => Err(FetchError::Failed(format!(
                "no whole batch at offset {} in the object store",
                req.from
            ))),
            Err(felix_cold::ColdError::TooOld { earliest, .. }) => {
                Err(FetchError::Behind { first: earliest })
            }
            Err(e) => Err(FetchError::Failed(e.to_string())),
        };
    }
    let end = log.committed_offset();
    if req.from > log.next_offset() {
        return Err(FetchError::Ahead {
            from: req.from,
            end,
        });
    }
    repl.followers.lock().insert(req.follower, req.from);
    repl.progress.notify_one();
    let mut committed = log.watch_committed();
    let wait = Duration::from_millis(req.wait_ms.min(5_000));
    let _ = tokio::time::timeout(wait, committed.wait_for(|c| *c > req.from)).await;
    drop(broker);
    let read = log
        .read(req.from, req.max_bytes.clamp(4096, 16 << 20), None)
        .map_err(|e| FetchError::Failed(e.to_string()))?;
    Ok(Bytes::from(read.batches))
}

/// HTTP/1.1 client of the leaders' fetch endpoints (pooled connections).
#[derive(Clone)]
pub struct ReplClient {
    http: hyper_util::client::legacy::Client<
        hyper_util::client::legacy::connect::HttpConnector,
        Full<Bytes>,
    >,
}

impl Default for ReplClient {
    fn default() -> Self {
        ReplClient {
            http: hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build_http(),
        }
    }
}

impl ReplClient {
    /// Forwards a publish to the shard's leader at `addr`. A failure to connect is a
    /// refusal (nothing was sent); a failure after sending leaves the outcome unknown.
    pub async fn forward_publish(
        &self,
        addr: &str,
        req: &ForwardedPublish,
        body: Bytes,
        timeout: Duration,
    ) -> Result<Option<(u64, u64)>, ErrorBody> {
        let unknown = |m: String| {
            ErrorBody::new(
                codes::INTERNAL,
                "forward_failed",
                format!(
                    "forwarding the publish to the shard's leader at {addr}: {m}; its outcome is unknown"
                ),
            )
        };
        if felix_meta::faults::isolated() {
            return Err(ErrorBody::new(
                codes::SHARD_UNAVAILABLE,
                "leader_unreachable",
                "this broker is cut off the network (fault injection)",
            )
            .retry_after(500));
        }
        let header = serde_json::to_string(req).map_err(|e| unknown(e.to_string()))?;
        let request = hyper::Request::post(format!("http://{addr}/repl/publish"))
            .header(PUBLISH_HEADER, header)
            .body(Full::new(body))
            .map_err(|e| unknown(e.to_string()))?;
        let response = match tokio::time::timeout(timeout, self.http.request(request)).await {
            Err(_) => return Err(unknown(format!("no answer within {timeout:?}"))),
            Ok(Err(e)) if e.is_connect() => {
                return Err(ErrorBody::new(
                    codes::SHARD_UNAVAILABLE,
                    "leader_unreachable",
                    format!("cannot reach the shard's leader at {addr}: {e}"),
                )
                .retry_after(500));
            }
            Ok(Err(e)) => return Err(unknown(e.to_string())),
            Ok(Ok(r)) => r,
        };
        let bytes = tokio::time::timeout(timeout, response.into_body().collect())
            .await
            .map_err(|_| unknown("the answer timed out".into()))?
            .map_err(|e| unknown(e.to_string()))?
            .to_bytes();
        match serde_json::from_slice::<ForwardedAnswer>(&bytes) {
            Ok(ForwardedAnswer::Published {
                base_offset,
                last_offset,
            }) => Ok(Some((base_offset, last_offset))),
            Ok(ForwardedAnswer::Done) => Ok(None),
            Ok(ForwardedAnswer::Error { error }) => Err(error),
            Err(e) => Err(unknown(format!("unreadable answer: {e}"))),
        }
    }

    pub async fn fetch(&self, addr: &str, req: &FetchRequest) -> Result<Bytes, FetchError> {
        if felix_meta::faults::isolated() {
            return Err(FetchError::Failed(
                "this node is cut off the network (fault injection)".into(),
            ));
        }
        let body = serde_json::to_vec(req).map_err(|e| FetchError::Failed(e.to_string()))?;
        let request = hyper::Request::post(format!("http://{addr}/repl/fetch"))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| FetchError::Failed(e.to_string()))?;
        let timeout = Duration::from_millis(req.wait_ms) + Duration::from_secs(5);
        let response = tokio::time::timeout(timeout, self.http.request(request))
            .await
            .map_err(|_| FetchError::Failed(format!("no answer from {addr} within {timeout:?}")))?
            .map_err(|e| FetchError::Failed(format!("{addr}: {e}")))?;
        let status = response.status();
        let bytes = tokio::time::timeout(timeout, response.into_body().collect())
            .await
            .map_err(|_| FetchError::Failed(format!("{addr}: body timed out")))?
            .map_err(|e| FetchError::Failed(format!("{addr}: {e}")))?
            .to_bytes();
        if status.is_success() {
            return Ok(bytes);
        }
        Err(
            serde_json::from_slice::<FetchError>(&bytes).unwrap_or_else(|_| {
                FetchError::Failed(format!(
                    "{addr} answered {status}: {}",
                    String::from_utf8_lossy(&bytes)
                ))
            }),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mark_is_what_a_majority_holds() {
        let replicas = [1, 2, 3];
        let ends = HashMap::from([(1, 100), (2, 60), (3, 10)]);
        let (mark, in_sync) = quorum_mark(&replicas, &ends, 0);
        assert_eq!(mark, 60);
        assert_eq!(in_sync.into_iter().collect::<Vec<_>>(), vec![1, 2]);
        // One replica unknown: the other two decide.
        let (mark, _) = quorum_mark(&replicas, &HashMap::from([(1, 100), (3, 30)]), 0);
        assert_eq!(mark, 30);
        // Alone, a leader of three holds no majority: the floor stays.
        let (mark, in_sync) = quorum_mark(&replicas, &HashMap::from([(1, 100)]), 7);
        assert_eq!(mark, 7);
        assert!(in_sync.contains(&1));
        // A single replica is its own majority.
        let (mark, _) = quorum_mark(&[4], &HashMap::from([(4, 9)]), 0);
        assert_eq!(mark, 9);
    }
}
