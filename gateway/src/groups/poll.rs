//! Handing records out: a poll claims up to N records of one shard for one consumer.
//!
//! Decides which records a poll gets and in what order: first records due for redelivery
//! (a lapsed claim or a nack whose delay passed), lowest offset first, each with its attempt
//! number plus one; then records never handed out, from the group's read position. The
//! invariants: a poll never returns a record at or past the shard's readable end (the
//! quorum mark on a replicated shard: [`Broker::fetch`] is bounded by it); a record's claim,
//! with its attempt number, is in the journal before the poll is answered; a record already
//! claimed and within its deadline is handed to no one. A poll with a wait parks on the
//! shard's readable end and on the next redelivery time, and costs nothing meanwhile.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use bytes::Bytes;
use felix_meta::model::{Group, GroupStart};
use felix_wire::groups::ClaimedMeta;
use felix_wire::protocol::{ErrorBody, codes};
use felix_wire::record::DEFAULT_MAX_DECOMPRESSED;
use felix_wire::{BatchIter, DecodedBatch, Record};
use tokio::time::Instant;

use super::cursor::{Cursor, Event};
use super::{GroupShard, now_ms};
use crate::broker::Broker;
use crate::errors::err;

/// Most records one poll hands out (each is a line of the answer's header).
pub const MAX_POLL_RECORDS: u32 = 500;
/// Longest wait of one poll.
pub const MAX_POLL_WAIT_MS: u64 = 5 * 60 * 1000;
/// Bytes a poll reads when it does not say.
const DEFAULT_POLL_BYTES: u64 = 1 << 20;
/// Longest consumer name.
pub const MAX_CONSUMER_LEN: usize = 128;

/// One poll's arguments.
pub(crate) struct Poll<'a> {
    pub tenant: &'a str,
    pub namespace: &'a str,
    pub stream: &'a str,
    pub group: &'a str,
    pub shard: u32,
    pub consumer: &'a str,
    pub max_records: u32,
    pub max_bytes: u64,
    pub wait_ms: u64,
}

/// What a poll handed out.
pub(crate) type Claimed = Vec<(ClaimedMeta, Record)>;

pub(crate) fn check_consumer(consumer: &str) -> Result<(), ErrorBody> {
    if consumer.is_empty() || consumer.len() > MAX_CONSUMER_LEN {
        return Err(err(
            codes::INVALID_ARGUMENT,
            "invalid_argument",
            format!("consumer must be 1-{MAX_CONSUMER_LEN} bytes"),
        ));
    }
    Ok(())
}

impl Broker {
    /// A poll: claims records of one shard, waiting up to `wait_ms` for some to arrive.
    pub(crate) async fn group_poll(&self, p: &Poll<'_>) -> Result<Claimed, ErrorBody> {
        check_consumer(p.consumer)?;
        if p.max_records == 0 || p.max_records > MAX_POLL_RECORDS {
            return Err(err(
                codes::INVALID_ARGUMENT,
                "invalid_argument",
                format!("max_records must be 1..={MAX_POLL_RECORDS}"),
            ));
        }
        if p.wait_ms > MAX_POLL_WAIT_MS {
            return Err(err(
                codes::INVALID_ARGUMENT,
                "invalid_argument",
                format!("wait_ms must be at most {MAX_POLL_WAIT_MS}"),
            ));
        }
        let until = Instant::now() + Duration::from_millis(p.wait_ms);
        loop {
            let group = self.group(p.tenant, p.namespace, p.stream, p.group)?;
            let gs = self
                .group_shard(p.tenant, p.namespace, p.stream, p.shard)
                .await?;
            // Watched before claiming: a record committed after the claim found nothing
            // still wakes the wait.
            let mut end = self.watch_high_watermark(p.tenant, p.namespace, p.stream, p.shard)?;
            end.borrow_and_update();
            let (claimed, next_due) = self.claim_once(&gs, &group, p).await?;
            let now = Instant::now();
            if !claimed.is_empty() || now >= until {
                return Ok(claimed);
            }
            let wake = match next_due {
                Some(due_ms) => {
                    let in_ms = (due_ms - now_ms()).max(1) as u64;
                    until.min(now + Duration::from_millis(in_ms))
                }
                None => until,
            };
            tokio::select! {
                changed = end.changed() => if changed.is_err() {
                    // The shard closed: the next round answers why.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                },
                _ = tokio::time::sleep_until(wake) => {}
            }
        }
    }

    /// One round of a poll: claims what is there now. Also returns when the earliest
    /// pending record falls due, for a poll that waits.
    async fn claim_once(
        &self,
        gs: &GroupShard,
        group: &Group,
        p: &Poll<'_>,
    ) -> Result<(Claimed, Option<i64>), ErrorBody> {
        let mut c = gs.cursor(group).await;
        let now = now_ms();
        c.saw(p.consumer, now);
        let mut tickets = Vec::new();
        if c.progress.next.is_none() {
            let to = self.group_start_offset(group, p.shard).await?;
            tickets.push(
                gs.record(&group.name, &mut c, vec![Event::Skip { to }])
                    .await?,
            );
        }
        if let Some(t) = super::dead_letter::settle(self, gs, group, &mut c, now).await {
            tickets.push(t);
        }
        let max_records = p.max_records as usize;
        let max_bytes = if p.max_bytes == 0 {
            DEFAULT_POLL_BYTES
        } else {
            p.max_bytes
        } as usize;
        let max_attempts = group.settings.max_attempts;
        let mut out: Vec<(u64, u32, Record)> = Vec::new();
        let mut bytes = 0usize;
        let mut events = Vec::new();
        let due: Vec<(u64, u32)> = c
            .progress
            .pending
            .iter()
            .filter(|(_, e)| e.due(now) && !e.exhausted(max_attempts, now))
            .map(|(o, e)| (*o, e.attempts))
            .take(max_records)
            .collect();
        let redelivered = due.len();
        if !due.is_empty() {
            let offsets: BTreeSet<u64> = due.iter().map(|(o, _)| *o).collect();
            let mut found = self.read_records_at(gs, &offsets).await?;
            for (offset, attempts) in due {
                match found.remove(&offset) {
                    Some(r) if bytes < max_bytes => {
                        bytes += record_bytes(&r);
                        out.push((offset, attempts + 1, r));
                    }
                    Some(_) => break,
                    // Removed by retention meanwhile: nothing left to hand out.
                    None => events.push(Event::Retire { offset }),
                }
            }
        }
        let old_next = c.progress.next.unwrap_or(0);
        let mut next = old_next;
        if out.len() < max_records && bytes < max_bytes {
            next = self
                .read_new(
                    gs,
                    next,
                    max_records,
                    max_bytes,
                    &mut out,
                    &mut bytes,
                    &mut events,
                )
                .await?;
        }
        let redelivered = redelivered.min(out.len()) as u64;
        let deadline_ms = now + group.settings.visibility_timeout_ms as i64;
        if !out.is_empty() || next != old_next {
            events.push(Event::Claim {
                consumer: p.consumer.to_owned(),
                deadline_ms,
                records: out.iter().map(|(o, a, _)| (*o, *a)).collect(),
                next,
            });
        }
        if !events.is_empty() {
            tickets.push(gs.record(&group.name, &mut c, events).await?);
        }
        let next_due = next_due(&c, max_attempts);
        drop(c);
        for t in tickets {
            GroupShard::written(t).await?;
        }
        self.node.metrics.group_handed_out(
            &gs.key,
            &group.name,
            out.len() as u64 - redelivered,
            redelivered,
        );
        let claimed = out
            .into_iter()
            .map(|(offset, attempt, r)| {
                (
                    ClaimedMeta {
                        offset,
                        attempt,
                        deadline_ms,
                    },
                    r,
                )
            })
            .collect();
        Ok((claimed, next_due))
    }

    /// Records never handed out, from `next`: appended to `out`; returns the new read
    /// position (past control batches and past the last record taken).
    #[allow(clippy::too_many_arguments)]
    async fn read_new(
        &self,
        gs: &GroupShard,
        next: u64,
        max_records: usize,
        max_bytes: usize,
        out: &mut Vec<(u64, u32, Record)>,
        bytes: &mut usize,
        events: &mut Vec<Event>,
    ) -> Result<u64, ErrorBody> {
        let k = &gs.key;
        let read = match self
            .fetch(
                &k.tenant,
                &k.namespace,
                &k.stream,
                k.shard,
                next,
                max_bytes - *bytes,
            )
            .await
        {
            Ok(read) => read,
            Err(e) if e.code == codes::OFFSET_TOO_OLD => {
                // Retention removed records the group never had: it continues at the
                // earliest one left.
                let to = e.earliest_offset.unwrap_or(next);
                events.push(Event::Skip { to });
                return Ok(to);
            }
            Err(e) => return Err(e),
        };
        let mut pos = next;
        for (header, batch) in BatchIter::new(&read.batches, usize::MAX).flatten() {
            let batch_end = (header.base_offset + i64::from(header.last_offset_delta) + 1) as u64;
            if header.is_control() {
                pos = pos.max(batch_end);
                continue;
            }
            let decoded = DecodedBatch::decode(batch, DEFAULT_MAX_DECOMPRESSED)
                .map_err(|e| err(codes::CORRUPT_DATA, "corrupt_segment", e.to_string()))?;
            for r in decoded.records {
                let offset = r.offset as u64;
                if offset < pos {
                    continue;
                }
                if out.len() >= max_records || (*bytes >= max_bytes && !out.is_empty()) {
                    return Ok(pos);
                }
                *bytes += record_bytes(&r);
                out.push((offset, 1, r));
                pos = offset + 1;
            }
            pos = pos.max(batch_end);
        }
        if read.batches.is_empty() {
            // A gap up to the readable end (nothing but removed or control records).
            return Ok(pos.max(read.next_offset));
        }
        Ok(pos)
    }

    /// The records at `offsets` of the shard (those still held in either tier).
    pub(crate) async fn read_records_at(
        &self,
        gs: &GroupShard,
        offsets: &BTreeSet<u64>,
    ) -> Result<HashMap<u64, Record>, ErrorBody> {
        let k = &gs.key;
        let mut found = HashMap::new();
        for &o in offsets {
            if found.contains_key(&o) {
                continue;
            }
            let read = match self
                .fetch(&k.tenant, &k.namespace, &k.stream, k.shard, o, 1)
                .await
            {
                Ok(read) => read,
                Err(e) if e.code == codes::OFFSET_TOO_OLD => continue,
                Err(e) => return Err(e),
            };
            for (header, batch) in BatchIter::new(&read.batches, usize::MAX).flatten() {
                if header.is_control() {
                    continue;
                }
                let decoded = DecodedBatch::decode(batch, DEFAULT_MAX_DECOMPRESSED)
                    .map_err(|e| err(codes::CORRUPT_DATA, "corrupt_segment", e.to_string()))?;
                for r in decoded.records {
                    if offsets.contains(&(r.offset as u64)) {
                        found.insert(r.offset as u64, r);
                    }
                }
            }
        }
        Ok(found)
    }

    /// Where a group new on this shard starts.
    pub(crate) async fn group_start_offset(
        &self,
        group: &Group,
        shard: u32,
    ) -> Result<u64, ErrorBody> {
        let (t, n, s) = (&group.tenant, &group.namespace, &group.stream);
        let b = self.shard_bounds(t, n, s, shard)?;
        let at_time = |ms| self.offset_for_time(t, n, s, shard, ms);
        Ok(match group.settings.start {
            GroupStart::Earliest => b.earliest,
            GroupStart::Latest => at_time(group.created_ms).await?.unwrap_or(b.high_watermark),
            GroupStart::Offset(o) => o.clamp(b.earliest, b.high_watermark),
            GroupStart::Timestamp(ms) => at_time(ms).await?.unwrap_or(b.high_watermark),
        })
    }
}

/// When the earliest pending record falls due (ms since the epoch).
fn next_due(c: &Cursor, _max_attempts: u32) -> Option<i64> {
    c.progress
        .pending
        .values()
        .map(|e| match &e.hold {
            super::cursor::Hold::Claimed { deadline_ms, .. } => *deadline_ms,
            super::cursor::Hold::Released { not_before_ms } => *not_before_ms,
        })
        .min()
}

fn record_bytes(r: &Record) -> usize {
    r.key.as_ref().map_or(0, Bytes::len) + r.value.as_ref().map_or(0, Bytes::len) + 16
}
