//! Single-writer fencing on the publish side: `publish_if(expected_offset)` (docs/groups.md,
//! "Single-writer projections").
//!
//! Decides when a conditional publish is written: only if the shard's next offset is the
//! one the writer expects, checked by the log atomically with the offset assignment
//! (`ShardLog::append_if`), so of N writers racing on one expected offset exactly one
//! writes and the others are refused with `expected_offset_mismatch` and the actual next
//! offset, having written nothing. The invariant: a conditional publish is one batch of a
//! durable shard on its leader, without an idempotent producer's sequence (the expected
//! offset already makes a retry safe: it is refused once the first try landed), answered
//! after the write (and, on a replicated Quorum shard, once the quorum mark covers it).

use bytes::Bytes;
use felix_hot::LogError;
use felix_wire::CheckedBatch;
use felix_wire::protocol::{AckMode, ErrorBody, codes};

use crate::broker::Broker;
use crate::errors::{err, log_error};
use crate::metrics::Metrics;
use crate::quota::PublishCost;
use crate::shard::shard_key;

impl Broker {
    /// Writes `body` (one batch) to the shard only if its next offset is `expected_offset`.
    pub(crate) async fn publish_if(
        &self,
        tenant: &str,
        namespace: &str,
        stream: &str,
        shard_no: u32,
        expected_offset: u64,
        body: Bytes,
    ) -> Result<(u64, u64), ErrorBody> {
        let key = shard_key(tenant, namespace, stream, shard_no);
        // Across a shard move's hand-over it waits for the owner, like a publish (`moves::hold`).
        if let Ok((s, _)) = self.shards.open(&key) {
            crate::moves::hold::wait_for_owner(&self.node, &s, std::time::Instant::now()).await?;
        }
        let (shard, settings) = self.shard(&key)?;
        let Some(log) = &shard.log else {
            return Err(err(
                codes::INVALID_ARGUMENT,
                "ephemeral_stream",
                "publish_if needs a durable stream: an ephemeral one has no offsets to expect",
            ));
        };
        let mut batches = CheckedBatch::split(&body, self.node.config.max_batch_bytes);
        let batch = match (batches.next(), batches.next()) {
            (Some(Ok(b)), None) => b,
            (Some(Err((pos, e))), _) => {
                return Err(err(
                    codes::BAD_REQUEST,
                    "invalid_batch",
                    format!("batch at byte {pos}: {e}"),
                ));
            }
            _ => {
                return Err(err(
                    codes::INVALID_ARGUMENT,
                    "invalid_argument",
                    "publish_if takes exactly one record batch",
                ));
            }
        };
        let h = *batch.header();
        if h.producer_id >= 0 {
            return Err(err(
                codes::INVALID_ARGUMENT,
                "invalid_argument",
                "publish_if takes a batch without an idempotent producer: the expected \
                 offset already makes a retry safe",
            ));
        }
        self.disk.check(batch.len() as u64)?;
        let cost = PublishCost {
            bytes: batch.len() as u64,
            records: h.records_count.max(0) as u64,
        };
        let Some(charge) = self
            .quotas
            .admit(tenant, AckMode::Commit, cost, &self.node.metrics)?
        else {
            return Err(err(
                codes::OVERLOADED,
                "tenant_quota",
                "over the publish quota",
            ));
        };
        let permit = match self
            .queues
            .admit(
                tenant,
                AckMode::Commit,
                &self.node.config,
                &self.node.metrics,
            )
            .await
        {
            Ok(Some(p)) => p,
            other => {
                self.quotas.refund(tenant, charge);
                other?;
                return Err(err(
                    codes::OVERLOADED,
                    "publish_queue_full",
                    "no publish slot",
                ));
            }
        };
        // Under the lock a hand-over takes after raising its fence (as `publish_durable`): an
        // append lands before the fence's end is read, or not here at all.
        let fence = shard.producers.lock().await;
        if shard.repl.as_ref().is_some_and(|r| r.moves.fenced()) {
            drop(fence);
            self.quotas.refund(tenant, charge);
            return Err(err(
                codes::SHARD_UNAVAILABLE,
                "moving",
                format!("shard {key} is being handed over to another broker; nothing was written"),
            )
            .retry_after(200));
        }
        // The batch goes in as checked above: its CRC is not computed again.
        let appended = log.append_checked_if(batch, expected_offset).await;
        drop(fence);
        let ticket = match appended {
            Ok(t) => t,
            Err(LogError::OffsetMismatch { next, .. }) => {
                let mut e = err(
                    codes::EXPECTED_OFFSET_MISMATCH,
                    "expected_offset_mismatch",
                    format!(
                        "shard {key}: the next offset is {next}, not {expected_offset}; \
                         nothing was written"
                    ),
                );
                e.next_offset = Some(next);
                return Err(e);
            }
            Err(e) => return Err(log_error(&e)),
        };
        let (first, last) = (ticket.base_offset, ticket.last_offset);
        ticket.committed().await.map_err(|e| log_error(&e))?;
        drop(permit);
        let quorum = settings.consistency == felix_meta::model::Consistency::Quorum;
        self.await_replicated(&shard, last, quorum).await?;
        let t = Metrics::tenant(tenant);
        let m = &self.node.metrics;
        m.publish_requests.get_or_create(&t).inc();
        m.publish_records.get_or_create(&t).inc_by(cost.records);
        m.publish_bytes.get_or_create(&t).inc_by(cost.bytes);
        Ok((first, last))
    }
}
