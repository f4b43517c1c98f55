//! The publish pipeline on the broker that leads the shard: validate every batch, charge the
//! tenant's publish quota (unless the broker that forwarded it, or the Kafka listener, did),
//! take a tenant slot, append (deduplicating idempotent producers), then answer when the ack mode
//! says so — on enqueue, after the write under the fsync policy, or once the quorum mark
//! covers the write.
//!
//! Invariant: a bad request changes nothing (every batch is checked before any is written);
//! an acknowledgement names offsets that are, or will be under the promise of its ack mode,
//! in the log, and a replicated broker acknowledges only while its lease holds (on a Quorum
//! stream only once a majority holds the write).

use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use felix_hot::ShardLog;
use felix_meta::Applied;
use felix_meta::model::{Command, Consistency, ShardKey};
use felix_wire::CheckedBatch;
use felix_wire::protocol::{AckMode, ErrorBody, codes};

use crate::admission::acks_after_write;
use crate::broker::Broker;
use crate::errors::{err, log_error};
use crate::metrics::{Metrics, TenantReason};
use crate::moves::hold;
use crate::producers::SeqCheck;
use crate::quota::PublishCost;
use crate::shard::Shard;

/// Whether a publish is charged to its tenant's quota here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum QuotaCharge {
    /// A client sent it to this broker: charge it, and refuse or shed it over quota.
    Here,
    /// Charged already: by the broker a client sent it to (forwarded here), or by the
    /// Kafka listener with a throttle.
    Charged,
}

/// On whose behalf a publish arrives: the token its caller presented and whether its
/// tenant's quota is still to be charged.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Publisher<'a> {
    pub token: Option<&'a str>,
    pub quota: QuotaCharge,
}

impl<'a> Publisher<'a> {
    /// A client's publish received here: checked against `token`, charged here.
    pub(crate) fn client(token: Option<&'a str>) -> Publisher<'a> {
        Publisher {
            token,
            quota: QuotaCharge::Here,
        }
    }
}

impl Broker {
    /// Publishes on this broker only (a forwarded publish lands here).
    pub(crate) async fn publish_here(
        &self,
        key: &ShardKey,
        ack: AckMode,
        body: Bytes,
        quota: QuotaCharge,
    ) -> Result<Option<(u64, u64)>, ErrorBody> {
        let m = &self.node.metrics;
        let tenant = &key.tenant[..];
        let t = Metrics::tenant(tenant);
        m.publish_requests.get_or_create(&t).inc();
        let mut result = self.publish_held(key, ack, body.clone(), quota).await;
        if let Err(e) = &result
            && self.node.catch_up_if_unknown(e).await
        {
            result = self.publish_held(key, ack, body, quota).await;
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

    /// [`publish_inner`](Self::publish_inner), held while the shard is handed over to
    /// another broker (`moves::hold`); a held publish that then finds the shard led
    /// elsewhere is answered `not_leader` with reason `moved`, for the forwarding broker.
    async fn publish_held(
        &self,
        key: &ShardKey,
        ack: AckMode,
        body: Bytes,
        quota: QuotaCharge,
    ) -> Result<Option<(u64, u64)>, ErrorBody> {
        let since = std::time::Instant::now();
        let mut held = false;
        loop {
            if let Ok((shard, _)) = self.shard(key) {
                held |= hold::wait_for_owner(&self.node, &shard, since).await?;
            }
            let result = self.publish_inner(key, ack, body.clone(), quota).await;
            match result {
                // It raced the fence: nothing was appended; hold it like the others.
                Err(e) if hold::met_fence(&e) => held = true,
                Err(mut e) if held && e.code == codes::NOT_LEADER => {
                    e.reason = hold::MOVED.to_owned();
                    return Err(e);
                }
                other => return other,
            }
        }
    }

    async fn publish_inner(
        &self,
        key: &ShardKey,
        ack: AckMode,
        body: Bytes,
        quota: QuotaCharge,
    ) -> Result<Option<(u64, u64)>, ErrorBody> {
        if self.node.stopping.load(Ordering::Acquire) {
            return Err(err(
                codes::SHARD_UNAVAILABLE,
                "stopping",
                "the broker is stopping",
            )
            .retry_after(1000));
        }
        let tenant = &key.tenant[..];
        let (shard, settings) = self.shard(key)?;
        let quorum = settings.consistency == Consistency::Quorum;
        // Validate every batch before anything is written: a bad request changes nothing.
        // This is the one CRC check on the publish path: the log takes the checked batches.
        let mut batches = Vec::new();
        let mut records = 0u64;
        for item in CheckedBatch::split(&body, self.node.config.max_batch_bytes) {
            match item {
                Ok(batch) => {
                    records += batch.header().records_count.max(0) as u64;
                    batches.push(batch);
                }
                Err((pos, felix_wire::WireError::InvalidLength { length, .. }))
                    if length as usize + 12 > self.node.config.max_batch_bytes =>
                {
                    return Err(err(
                        codes::RECORD_TOO_LARGE,
                        "record_too_large",
                        format!(
                            "batch at byte {pos} is {} bytes; the limit is {} (max_batch_bytes)",
                            length + 12,
                            self.node.config.max_batch_bytes
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

        let bytes_len = body.len() as u64;
        // The tenant's publish rate, before anything is taken for the publish: a refusal or
        // a shed holds no slot and writes nothing.
        let charge = match quota {
            QuotaCharge::Here => {
                let cost = PublishCost {
                    bytes: bytes_len,
                    records,
                };
                match self.quotas.admit(tenant, ack, cost, &self.node.metrics)? {
                    Some(charge) => Some(charge),
                    None => return Ok(None),
                }
            }
            QuotaCharge::Charged => None,
        };
        // Backpressure: the tenant's own publish slots. A publish turned away here was not
        // written, so its quota charge is given back.
        let admitted = self
            .queues
            .admit(tenant, ack, &self.node.config, &self.node.metrics)
            .await;
        let Ok(Some(permit)) = admitted else {
            if let Some(charge) = charge {
                self.quotas.refund(tenant, charge);
            }
            return admitted.map(|_| None);
        };
        let result = match &shard.log {
            Some(log) => {
                self.publish_durable(&shard, log, batches, ack, quorum)
                    .await
            }
            None => {
                let batches = batches.into_iter().map(CheckedBatch::into_parts).collect();
                crate::ephemeral::publish(&shard, batches, &self.node.metrics).await
            }
        };
        drop(permit);
        // Met a shard move's fence: nothing was written and the publish is tried again after
        // the hold (`publish_held`), where it is charged again.
        if let (Err(e), Some(charge)) = (&result, charge)
            && hold::met_fence(e)
        {
            self.quotas.refund(tenant, charge);
        }
        if result.is_ok() {
            let t = Metrics::tenant(tenant);
            self.node
                .metrics
                .publish_records
                .get_or_create(&t)
                .inc_by(records);
            self.node
                .metrics
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
        batches: Vec<CheckedBatch>,
        ack: AckMode,
        quorum: bool,
    ) -> Result<(u64, u64), ErrorBody> {
        let bytes: usize = batches.iter().map(CheckedBatch::len).sum();
        self.disk.check(bytes as u64)?;
        let mut tickets = Vec::with_capacity(batches.len());
        let mut duplicate_range: Option<(u64, u64)> = None;
        {
            let mut producers = shard.producers.lock().await;
            // Checked under the lock the hand-over takes after raising the fence: an append
            // either finished before the fence's end was read or does not happen here (nor
            // once the shard is led elsewhere, whatever was checked before the lock).
            if !hold::may_append(shard) {
                return Err(hold::fenced_at_append(shard));
            }
            for batch in batches {
                let h = *batch.header();
                match producers.check(&h) {
                    SeqCheck::Append => {
                        let ticket = log.append_checked(batch).await.map_err(|e| log_error(&e))?;
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
        let commit_ack = acks_after_write(ack, &self.node.config);
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
                .map(|_| &*self.node.lease);
            let margin = Duration::from_millis(self.node.config.lease_ms / 2);
            let acked = ack == AckMode::Batch && !replicated_quorum;
            crate::enqueue_ack::settle(tickets, lease, margin, acked, &self.node.metrics).await?;
        }
        if shard.repl.is_some() && ack != AckMode::None {
            // Fault injection only: a test holds the answer here, after the write.
            felix_meta::faults::wait_while_answers_held().await;
            self.await_replicated(shard, last, quorum).await?;
        }
        Ok((first, last))
    }

    /// In a cluster, before an acknowledgement goes out: on a Quorum stream, waits until the
    /// quorum mark (recorded in the control plane) covers `last`, at most
    /// `publish_quorum_timeout_ms`; on a Leader stream, re-checks the lease.
    pub(crate) async fn await_replicated(
        &self,
        shard: &Shard,
        last: u64,
        quorum: bool,
    ) -> Result<(), ErrorBody> {
        let Some(repl) = &shard.repl else {
            return Ok(());
        };
        if quorum {
            let wait = Duration::from_millis(self.node.config.publish_quorum_timeout_ms);
            return if repl.mark.wait_past(last, wait).await {
                Ok(())
            } else {
                self.node.metrics.quorum_timeouts.inc();
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
            };
        }
        if self.node.lease.holds() {
            Ok(())
        } else {
            Err(unvouched(&shard.key))
        }
    }

    /// Allocates an idempotent producer id from the control plane.
    pub async fn producer_init(&self) -> Result<(i64, i16), ErrorBody> {
        match self
            .node
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
}

/// The answer to a write that landed here while this broker led the shard, when its lease
/// lapsed before the answer: it cannot vouch for the write (another broker may lead by
/// now), yet the write is in its log and stays there if it leads again. So the outcome is
/// unknown, not refused: a retryable refusal here would have a client re-send a write that
/// is already stored, and store it twice (issue 25). An idempotent producer's re-send lands
/// once.
pub(crate) fn unvouched(key: &ShardKey) -> ErrorBody {
    err(
        codes::LEADERSHIP_LOST,
        "leadership_lost",
        format!(
            "shard {key}: the write landed on this broker but its lease lapsed before it \
             could answer, so it cannot vouch for it; the outcome is unknown (re-send through \
             an idempotent producer to land it once)"
        ),
    )
    .retry_after(500)
}
