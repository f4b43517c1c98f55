//! Copying a range of a shard's records from another replica, to rewrite a damaged local
//! segment.
//!
//! Decides who serves a copy and what it may contain: any broker holding an open copy of
//! the shard (leader or follower) answers from its own log with verified reads (each batch's
//! CRC, offsets dense from the requested one), up to the requested end, whatever its role;
//! the requester checks the gathered copy again as a whole segment before it replaces
//! anything (`ShardLog::replace_sealed_segment`). A replica whose own copy of the range is
//! damaged refuses, and the requester asks the next one.

use std::time::Duration;

use bytes::Bytes;
use felix_hot::LogError;
use felix_meta::model::ShardKey;
use serde::{Deserialize, Serialize};

use super::transport::{FetchError, PeerClient};
use crate::broker::Broker;

/// Most bytes one answer carries; a segment is gathered in several.
const COPY_BYTES: usize = 4 << 20;

/// Records `[from, to)` of a shard, at most `max_bytes` of them (at least one batch).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SegmentCopyRequest {
    pub shard: ShardKey,
    pub from: u64,
    pub to: u64,
    pub max_bytes: usize,
}

/// Serves `POST /repl/segment`: whole batches from `req.from`, below `req.to`.
pub(crate) async fn serve(broker: &Broker, req: SegmentCopyRequest) -> Result<Bytes, FetchError> {
    let log = broker
        .shards
        .get(&req.shard)
        .and_then(|s| s.log.clone())
        .ok_or_else(|| FetchError::Failed("this broker holds no open copy of the shard".into()))?;
    let max = req.max_bytes.clamp(1, COPY_BYTES);
    let read = tokio::task::spawn_blocking(move || log.read(req.from, max, Some(req.to)))
        .await
        .map_err(|e| FetchError::Failed(format!("read task failed: {e}")))?;
    match read {
        Ok(read) => Ok(Bytes::from(read.batches)),
        Err(LogError::OffsetOutOfRange { first, .. }) if req.from < first => {
            Err(FetchError::Behind { first })
        }
        Err(e) => Err(FetchError::Failed(e.to_string())),
    }
}

/// Gathers records `[from, to)` of `shard` from the broker at `addr`.
pub(crate) async fn copy_range(
    peers: &PeerClient,
    addr: &str,
    shard: &ShardKey,
    from: u64,
    to: u64,
) -> Result<Vec<u8>, FetchError> {
    let mut copy = Vec::new();
    let mut pos = from;
    while pos < to {
        let req = SegmentCopyRequest {
            shard: shard.clone(),
            from: pos,
            to,
            max_bytes: COPY_BYTES,
        };
        let bytes = peers
            .call(
                addr,
                "/repl/segment",
                &req,
                Duration::from_secs(30),
                FetchError::Failed,
            )
            .await?
            .body;
        let next = last_offset_after(&bytes).ok_or_else(|| {
            FetchError::Failed(format!("{addr} answered no whole batch from offset {pos}"))
        })?;
        if next <= pos {
            return Err(FetchError::Failed(format!(
                "{addr} answered batches that do not move past offset {pos}"
            )));
        }
        copy.extend_from_slice(&bytes);
        pos = next;
    }
    Ok(copy)
}

/// One past the last offset of the batches in `bytes`, if they hold any. Only headers are
/// read here: the log checks every batch when it takes the copy.
fn last_offset_after(bytes: &[u8]) -> Option<u64> {
    felix_wire::BatchIter::new(bytes, usize::MAX)
        .map_while(Result::ok)
        .last()
        .map(|(h, _)| h.last_offset() as u64 + 1)
}
