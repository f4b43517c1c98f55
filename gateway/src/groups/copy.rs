//! Copying a shard's group journal from one replica to another (`POST /repl/groups`).
//!
//! A follower asks the shard's leader, at the leader's generation, for the journal from the
//! end of its own copy; that offset is also its report (it holds everything below it). A new
//! leader recovering asks any replica, whatever its role, for the state of its copy and the
//! records it lacks. Every answer carries the server's copy's first offset, end and last
//! batch's generation in headers, so one request also serves as a status query.
//!
//! Decides when two copies diverge: the asker names the generation of its last batch; when
//! the server's batch at that offset has another generation, or the server's copy ends
//! before it, the copies diverge, and the server answers where the asker's generation ends
//! in its copy: the asker cuts its copy there (it held records no later leader kept).
//!
//! Invariant: batches are copied unchanged, with their offsets and generations, so two
//! copies that agree on the generation of a batch agree on everything before it.

use std::sync::Weak;
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use felix_meta::model::ShardKey;
use serde::{Deserialize, Serialize};

use super::journal;
use crate::broker::BrokerSlot;
use crate::replication::transport::PeerClient;

/// The internal route.
pub const PATH: &str = "/repl/groups";

const FIRST: &str = "x-journal-first";
const END: &str = "x-journal-end";
const LAST_GENERATION: &str = "x-journal-last-generation";
const DIVERGED_AT: &str = "x-journal-diverged-at";

/// A request for a shard's journal from `from` on.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CopyRequest {
    pub shard: ShardKey,
    /// `Some(g)`: a follower of this broker at generation `g` (refused unless this broker
    /// leads the shard at `g`; its `from` counts as its report). `None`: a new leader
    /// recovering, served whatever this broker's role.
    pub generation: Option<u64>,
    pub replica: u64,
    /// The asker holds the journal below this offset.
    pub from: u64,
    /// The generation of the asker's last batch (`-1`: it holds none).
    pub last_generation: i32,
    /// 0: only the state of the copy.
    pub max_bytes: usize,
    pub wait_ms: u64,
}

/// The state of a copy and what was asked for of it.
#[derive(Debug, Clone, Default)]
pub struct CopyAnswer {
    pub first: u64,
    pub end: u64,
    pub last_generation: i32,
    /// Set when the asker's copy diverges: keep what is below this offset.
    pub diverged_at: Option<u64>,
    pub batches: Bytes,
}

/// Why a copy request was refused.
#[derive(Debug, Clone, Serialize, Deserialize, thiserror::Error)]
#[serde(tag = "error", rename_all = "snake_case")]
pub enum CopyError {
    #[error("this broker does not lead the shard at generation {generation:?}")]
    NotLeader { generation: Option<u64> },
    #[error("the journal starts at {first}, after the asked offset: re-seed from there")]
    Behind { first: u64 },
    #[error("{0}")]
    Failed(String),
}

impl IntoResponse for CopyError {
    fn into_response(self) -> Response {
        let status = match self {
            CopyError::NotLeader { .. } => StatusCode::CONFLICT,
            CopyError::Behind { .. } => StatusCode::GONE,
            CopyError::Failed(_) => StatusCode::SERVICE_UNAVAILABLE,
        };
        (status, Json(self)).into_response()
    }
}

impl IntoResponse for CopyAnswer {
    fn into_response(self) -> Response {
        let mut h = HeaderMap::new();
        let mut put = |k: &'static str, v: String| {
            if let Ok(v) = HeaderValue::from_str(&v) {
                h.insert(k, v);
            }
        };
        put(FIRST, self.first.to_string());
        put(END, self.end.to_string());
        put(LAST_GENERATION, self.last_generation.to_string());
        if let Some(at) = self.diverged_at {
            put(DIVERGED_AT, at.to_string());
        }
        (h, self.batches).into_response()
    }
}

/// The route's handler.
pub(crate) async fn serve(
    State(slot): State<BrokerSlot>,
    Json(req): Json<CopyRequest>,
) -> Result<CopyAnswer, CopyError> {
    let broker = slot
        .get()
        .and_then(Weak::upgrade)
        .ok_or_else(|| CopyError::Failed("the broker is starting".into()))?;
    let shard = broker
        .open_replica(&req.shard)
        .map_err(|e| CopyError::Failed(e.message))?;
    if let Some(generation) = req.generation {
        let leading = shard.repl.as_ref().and_then(|r| r.leading());
        if leading != Some(generation) {
            return Err(CopyError::NotLeader {
                generation: leading,
            });
        }
    }
    let j = broker
        .journal_log(&shard)
        .await
        .map_err(|e| CopyError::Failed(e.message))?;
    drop(broker);
    if let Some(generation) = req.generation {
        if !j.mark.serves(generation) {
            // Still taking the journal over: a follower must not compare its copy with one
            // that is not the journal's history yet.
            return Err(CopyError::NotLeader { generation: None });
        }
        j.mark.report(generation, req.replica, req.from);
    }
    let log = j.log;
    let state = |batches: Bytes, diverged_at: Option<u64>| CopyAnswer {
        first: log.first_offset(),
        end: log.committed_offset(),
        last_generation: journal::last_generation(&log),
        diverged_at,
        batches,
    };
    let end = log.committed_offset();
    if req.last_generation >= 0 && req.from > log.first_offset() {
        // Does the asker's last batch match this copy's batch at that offset?
        let mine = if req.from <= end {
            journal::generation_at(&log, req.from - 1)
        } else {
            None
        };
        if mine != Some(req.last_generation) {
            let at = journal::end_of_generation(&log, req.last_generation).min(req.from - 1);
            return Ok(state(Bytes::new(), Some(at)));
        }
    }
    if req.max_bytes == 0 {
        return Ok(state(Bytes::new(), None));
    }
    if req.from < log.first_offset() {
        return Err(CopyError::Behind {
            first: log.first_offset(),
        });
    }
    let mut committed = log.watch_committed();
    let wait = Duration::from_millis(req.wait_ms.min(5_000));
    let _ = tokio::time::timeout(wait, committed.wait_for(|c| *c > req.from)).await;
    let read = log
        .read(req.from, req.max_bytes.clamp(4096, 16 << 20), None)
        .map_err(|e| CopyError::Failed(e.to_string()))?;
    Ok(state(Bytes::from(read.batches), None))
}

/// Asks the broker at `addr` for its copy of a journal.
pub(crate) async fn fetch(
    client: &PeerClient,
    addr: &str,
    req: &CopyRequest,
) -> Result<CopyAnswer, CopyError> {
    let timeout = Duration::from_millis(req.wait_ms) + Duration::from_secs(3);
    let answer = client
        .call(addr, PATH, req, timeout, CopyError::Failed)
        .await?;
    let header = |k: &str| -> Option<i64> {
        answer
            .headers
            .get(k)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
    };
    let (Some(first), Some(end), Some(last)) =
        (header(FIRST), header(END), header(LAST_GENERATION))
    else {
        return Err(CopyError::Failed(format!(
            "{addr}: the answer lacks the journal's state"
        )));
    };
    Ok(CopyAnswer {
        first: first as u64,
        end: end as u64,
        last_generation: last as i32,
        diverged_at: header(DIVERGED_AT).map(|v| v as u64),
        batches: answer.body,
    })
}

/// Brings `j`'s copy up to the answer's batches: appends them unchanged, or cuts the copy
/// where it diverges. Returns the copy's new end.
pub(crate) async fn apply(
    broker: &crate::broker::Broker,
    j: &mut super::replica::JournalLog,
    answer: &CopyAnswer,
) -> Result<u64, String> {
    if let Some(at) = answer.diverged_at {
        let next = j.log.committed_offset();
        if at < j.log.first_offset() {
            // Diverged below what this copy still holds: start again at the source's first.
            *j = broker
                .reseed_journal(&j.shard, answer.first)
                .await
                .map_err(|e| e.message)?;
        } else {
            j.log
                .truncate_to(at)
                .await
                .map_err(|e| format!("cut the journal at {at}: {e}"))?;
        }
        tracing::warn!(shard = %j.shard.key, from = at, to = next,
            "group journal: dropped records no later leader kept");
        return Ok(j.log.committed_offset());
    }
    let mut last = None;
    for item in felix_wire::BatchIter::new(&answer.batches, usize::MAX) {
        let (_, bytes) = item.map_err(|(_, e)| format!("a damaged journal batch: {e}"))?;
        match j.log.append_at(bytes.to_vec()).await {
            Ok(t) => last = Some(t),
            Err(e) => {
                // E.g. batches of an older generation than this copy once led at (its
                // generation never goes back): copy the source's journal whole instead.
                tracing::warn!(shard = %j.shard.key, error = %e,
                    "group journal: re-seeding this copy from its source");
                *j = broker
                    .reseed_journal(&j.shard, answer.first)
                    .await
                    .map_err(|e| e.message)?;
                return Ok(j.log.committed_offset());
            }
        }
    }
    if let Some(t) = last {
        t.committed().await.map_err(|e| e.to_string())?;
    }
    Ok(j.log.committed_offset())
}

/// This copy's request for more after its end.
pub(crate) fn request_from(
    j: &super::replica::JournalLog,
    generation: Option<u64>,
    me: u64,
    max_bytes: usize,
    wait_ms: u64,
) -> CopyRequest {
    CopyRequest {
        shard: j.shard.key.clone(),
        generation,
        replica: me,
        from: j.log.committed_offset(),
        last_generation: journal::last_generation(&j.log),
        max_bytes,
        wait_ms,
    }
}
