//! Dead letters: a record whose last permitted delivery was nacked or lapsed is published
//! to the group's dead-letter stream, once, then retired; without a dead-letter stream it
//! is retired and counted.
//!
//! Decides how "once" holds across retries and restarts: each group has an idempotent
//! producer (its id in the journal), and the records one pass dead-letters go as one batch
//! of it, each record's dead-letter shard and sequence in that batch written to the journal
//! before the batch is published. A retry (the publish failed, or the broker restarted
//! before the retirement was written) publishes exactly the batch that began, which the
//! dead-letter shard's leader answers without appending again. The invariant: a group's
//! dead-letter batches on one shard are published one at a time, in sequence order, and a
//! new one begins only once none is left begun, so the sequences the dead-letter shard sees
//! never skip and the records begun are always the one batch to publish again.

use std::collections::BTreeSet;

use bytes::Bytes;
use felix_hot::Appended;
use felix_meta::model::Group;
use felix_wire::groups::dead_letter_headers as h;
use felix_wire::protocol::{AckMode, ErrorBody, codes};
use felix_wire::{BatchBuilder, Compression, Header, Record};
use tracing::warn;

use super::GroupShard;
use super::cursor::{Cursor, Event};
use super::duty::BrokerDuty;
use crate::broker::Broker;
use crate::publish::Publisher;

/// Most records dead-lettered in one pass (the rest wait for the next).
const PER_PASS: usize = 64;
/// Most passes one call makes (the rest wait for the next poll or the sweep).
const MAX_PASSES: usize = 16;

/// Dead-letters (or retires) the group's exhausted records on this shard, one batch a pass.
/// The cursor's lock is held to choose a batch and record its beginning, and again to
/// retire it, not while it is published: a publish (a write to the dead-letter shard, maybe
/// on another broker) would hold up every poll and answer of the group on this shard. Passes
/// of a group on a shard take turns; `wait`: wait for a pass under way and then make one (a
/// nack, answered once its records are dead-lettered), else leave the records to it.
/// Failures are logged and retried by the next poll or the once-a-second sweep.
pub(crate) async fn settle(broker: &Broker, gs: &GroupShard, group: &Group, wait: bool) {
    let turn = gs.cursor(group).await.dead_lettering.clone();
    let _turn = if wait {
        turn.lock_owned().await
    } else {
        match turn.try_lock_owned() {
            Ok(t) => t,
            Err(_) => return,
        }
    };
    for _ in 0..MAX_PASSES {
        match pass(broker, gs, group).await {
            Ok(true) => {}
            Ok(false) => return,
            Err(e) => {
                warn!(shard = %gs.key, group = group.name, dead_letter = ?group.settings.dead_letter,
                    error = %e, "dead-lettering failed; retrying at the next poll");
                return;
            }
        }
    }
}

/// One pass: whether it dead-lettered (or retired) anything.
async fn pass(broker: &Broker, gs: &GroupShard, group: &Group) -> Result<bool, ErrorBody> {
    let mut c = gs.cursor(group).await;
    let now = super::now_ms();
    let max = group.settings.max_attempts;
    let exhausted: Vec<u64> = c
        .progress
        .pending
        .iter()
        .filter(|(_, e)| e.exhausted(max, now))
        .map(|(o, _)| *o)
        .take(PER_PASS)
        .collect();
    if exhausted.is_empty() {
        return Ok(false);
    }
    let Some(dlq) = &group.settings.dead_letter else {
        retire(broker, gs, group, c, &exhausted).await?;
        return Ok(true);
    };
    let Some(begun) = begin(broker, gs, group, dlq, &mut c, &exhausted).await? else {
        return Ok(false);
    };
    drop(c);
    if let Some(t) = begun.ticket {
        gs.written(t).await?;
    }
    broker
        .publish_for(
            Publisher::client(None),
            Some(BrokerDuty::DeadLetter {
                tenant: gs.key.tenant.clone(),
                namespace: gs.key.namespace.clone(),
                stream: gs.key.stream.clone(),
                group: group.name.clone(),
            }),
            (&begun.to.0, &begun.to.1, &begun.to.2, begun.dshard),
            AckMode::Commit,
            begun.batch,
        )
        .await?;
    let c = gs.cursor(group).await;
    retire(broker, gs, group, c, &begun.offsets).await?;
    Ok(true)
}

/// Retires `offsets` (dead-lettered, or past their attempts without a dead-letter stream)
/// under the cursor `c`, counts them once the journal entry is written, and waits for it.
async fn retire(
    broker: &Broker,
    gs: &GroupShard,
    group: &Group,
    mut c: tokio::sync::OwnedMutexGuard<Cursor>,
    offsets: &[u64],
) -> Result<(), ErrorBody> {
    let events = offsets
        .iter()
        .map(|&offset| Event::Retire { offset })
        .collect();
    let n = c.progress.pending.len();
    let ticket = gs.record(&group.name, &mut c, events).await?;
    let retired = (n - c.progress.pending.len()) as u64;
    drop(c);
    broker
        .node
        .metrics
        .group_dead_lettered(&gs.key, &group.name, retired);
    gs.written(ticket).await
}

/// A dead-letter batch ready to publish: its records' beginning recorded (`ticket`, to be
/// written first; `None` for a batch begun before), built with their sequences.
struct Begun {
    ticket: Option<Appended>,
    /// The dead-letter stream and shard.
    to: (String, String, String),
    dshard: u32,
    batch: Bytes,
    offsets: Vec<u64>,
}

/// Chooses the batch to publish (the one begun and not retired, else the `exhausted`
/// records, as many as [`BATCH_BYTES`] holds), records its beginning, and builds it.
/// `None` when nothing is left to publish (records retention removed are retired here).
async fn begin(
    broker: &Broker,
    gs: &GroupShard,
    group: &Group,
    dlq: &str,
    c: &mut Cursor,
    exhausted: &[u64],
) -> Result<Option<Begun>, ErrorBody> {
    let mut parts = dlq.splitn(3, '/');
    let (Some(dt), Some(dn), Some(ds)) = (parts.next(), parts.next(), parts.next()) else {
        return Ok(None);
    };
    let (_, settings) = broker.node.stream_settings(dt, dn, ds)?;
    let shards = settings.shards.max(1);
    if c.progress.producer.is_none() {
        let (id, epoch) = broker.producer_init().await?;
        let t = gs
            .record(&group.name, c, vec![Event::Producer { id, epoch }])
            .await?;
        gs.written(t).await?;
    }
    let Some((producer, epoch)) = c.progress.producer else {
        return Ok(None);
    };
    // A batch begun before and not retired (its publish failed, or the broker stopped) is
    // published again exactly as it began, before anything new begins.
    let (dshard, batch, mut records, ticket) = match begun_batch(c) {
        Some((dshard, batch)) => {
            let wanted: BTreeSet<u64> = batch.iter().map(|(o, _)| *o).collect();
            let records = broker.read_records_at(gs, &wanted).await?;
            (dshard, batch, records, None)
        }
        None => {
            let wanted: BTreeSet<u64> = exhausted.iter().copied().collect();
            let mut records = broker.read_records_at(gs, &wanted).await?;
            // Removed by retention meanwhile: nothing to copy, retired at once.
            let gone: Vec<Event> = exhausted
                .iter()
                .filter(|o| !records.contains_key(o))
                .map(|&offset| Event::Retire { offset })
                .collect();
            if !gone.is_empty() {
                let n = gone.len() as u64;
                let t = gs.record(&group.name, c, gone).await?;
                gs.written(t).await?;
                broker
                    .node
                    .metrics
                    .group_dead_lettered(&gs.key, &group.name, n);
            }
            let dshard = gs.key.shard % shards;
            let first = c.progress.sequences.get(&dshard).copied().unwrap_or(0);
            let mut batch = Vec::new();
            let mut bytes = 0usize;
            for &offset in exhausted {
                let Some(r) = records.get(&offset) else {
                    continue;
                };
                let size = record_bytes(r);
                if !batch.is_empty() && bytes + size > BATCH_BYTES {
                    break;
                }
                bytes += size;
                batch.push((offset, first.wrapping_add(batch.len() as i32)));
            }
            if batch.is_empty() {
                return Ok(None);
            }
            // Each record's place in the batch is in the journal before the batch is
            // published (the caller waits for it), so a retry publishes the same batch.
            let begin = batch
                .iter()
                .map(|&(offset, seq)| Event::DeadLetterBegin {
                    offset,
                    shard: dshard,
                    seq,
                })
                .collect();
            let t = gs.record(&group.name, c, begin).await?;
            records.retain(|o, _| batch.iter().any(|(b, _)| b == o));
            (dshard, batch, records, Some(t))
        }
    };
    let mut builder = BatchBuilder::new(Compression::None);
    for &(offset, _) in &batch {
        let Some(entry) = c.progress.pending.get(&offset) else {
            continue;
        };
        // A record retention removed after its dead-lettering began still takes its place
        // in the batch (its headers, no key or payload): the batch keeps the sequences it
        // began with.
        let r = records.remove(&offset).unwrap_or(Record {
            offset: 0,
            timestamp: super::now_ms(),
            key: None,
            value: None,
            headers: Vec::new(),
        });
        builder.push(dead_letter_record(
            gs,
            group,
            offset,
            entry.attempts,
            &entry.reason,
            r,
        ));
    }
    let bytes = builder
        .producer(producer, epoch, batch[0].1)
        .build()
        .map_err(|e| crate::errors::err(codes::INTERNAL, "internal", e.to_string()))?;
    Ok(Some(Begun {
        ticket,
        to: (dt.to_owned(), dn.to_owned(), ds.to_owned()),
        dshard,
        batch: Bytes::from(bytes),
        offsets: batch.iter().map(|(o, _)| *o).collect(),
    }))
}

/// Most bytes of records one dead-letter batch carries (at least one record).
const BATCH_BYTES: usize = 1 << 20;

fn record_bytes(r: &Record) -> usize {
    r.key.as_ref().map_or(0, |k| k.len())
        + r.value.as_ref().map_or(0, |v| v.len())
        + r.headers
            .iter()
            .map(|h| h.key.len() + h.value.as_ref().map_or(0, |v| v.len()))
            .sum::<usize>()
}

/// The records whose dead-lettering began and did not finish, as the one batch they began
/// as: those of one dead-letter shard in sequence order (offset, sequence). A pass begins a
/// batch only when none is left begun, so the records begun form one run of sequences
/// (journals written one record per batch hold at most one begun record per shard).
fn begun_batch(c: &Cursor) -> Option<(u32, Vec<(u64, i32)>)> {
    let mut begun: Vec<(u32, i32, u64)> = c
        .progress
        .pending
        .iter()
        .filter_map(|(o, e)| e.dead_letter.map(|(shard, seq)| (shard, seq, *o)))
        .collect();
    begun.sort_unstable();
    let &(dshard, first_seq, _) = begun.first()?;
    let mut batch = Vec::new();
    for (shard, seq, offset) in begun {
        if shard != dshard || seq != first_seq.wrapping_add(batch.len() as i32) {
            break;
        }
        batch.push((offset, seq));
    }
    Some((dshard, batch))
}

/// The dead-letter copy: the record's key, payload and timestamp, the headers naming where
/// it came from and why, then its own headers.
fn dead_letter_record(
    gs: &GroupShard,
    group: &Group,
    offset: u64,
    attempts: u32,
    reason: &Option<String>,
    r: Record,
) -> Record {
    let k = &gs.key;
    let header = |key: &str, value: String| Header {
        key: key.to_owned(),
        value: Some(Bytes::from(value)),
    };
    let mut headers = vec![
        header(
            h::STREAM,
            format!("{}/{}/{}", k.tenant, k.namespace, k.stream),
        ),
        header(h::SHARD, k.shard.to_string()),
        header(h::OFFSET, offset.to_string()),
        header(h::GROUP, group.name.clone()),
        header(h::ATTEMPTS, attempts.to_string()),
    ];
    if let Some(reason) = reason {
        headers.push(header(h::REASON, reason.clone()));
    }
    headers.extend(r.headers);
    Record {
        offset: 0,
        timestamp: r.timestamp,
        key: r.key,
        value: r.value,
        headers,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claimed(c: &mut Cursor, offsets: &[u64]) {
        c.apply(&Event::Claim {
            consumer: "a".into(),
            deadline_ms: 1,
            records: offsets.iter().map(|&o| (o, 1)).collect(),
            next: offsets.iter().max().map_or(0, |o| o + 1),
        });
    }

    fn begin(c: &mut Cursor, offset: u64, shard: u32, seq: i32) {
        c.apply(&Event::DeadLetterBegin { offset, shard, seq });
    }

    #[test]
    fn a_begun_batch_is_published_again_as_it_began() {
        let mut c = Cursor::new(1);
        c.apply(&Event::Skip { to: 0 });
        claimed(&mut c, &[3, 5, 7, 9, 11]);
        assert_eq!(
            begun_batch(&c),
            None,
            "nothing begun: a new batch may begin"
        );
        // Begun as one batch in offset order, sequences 4..=6.
        begin(&mut c, 5, 0, 4);
        begin(&mut c, 7, 0, 5);
        begin(&mut c, 9, 0, 6);
        assert_eq!(begun_batch(&c), Some((0, vec![(5, 4), (7, 5), (9, 6)])));
        // A record begun one at a time by an older broker, alone on its shard: its own batch.
        let mut old = Cursor::new(1);
        old.apply(&Event::Skip { to: 0 });
        claimed(&mut old, &[3, 5]);
        begin(&mut old, 5, 2, 9);
        assert_eq!(begun_batch(&old), Some((2, vec![(5, 9)])));
        // Sequence order, whatever the offsets' order.
        let mut c = Cursor::new(1);
        c.apply(&Event::Skip { to: 0 });
        claimed(&mut c, &[3, 5]);
        begin(&mut c, 5, 0, 0);
        begin(&mut c, 3, 0, 1);
        assert_eq!(begun_batch(&c), Some((0, vec![(5, 0), (3, 1)])));
        // Retired: nothing begun is left.
        c.apply(&Event::Retire { offset: 5 });
        c.apply(&Event::Retire { offset: 3 });
        assert_eq!(begun_batch(&c), None);
    }
}
