//! Dead letters: a record whose last permitted delivery was nacked or lapsed is published
//! to the group's dead-letter stream, once, then retired; without a dead-letter stream it
//! is retired and counted.
//!
//! Decides how "once" holds across retries and restarts: each group has an idempotent
//! producer (its id in the journal), and a record's dead-letter copy gets its shard and
//! sequence written to the journal before it is published. A retry (the publish failed, or
//! the broker restarted before the retirement was written) publishes the same sequence,
//! which the dead-letter shard's leader answers without appending again. The invariant:
//! dead letters of one group and shard are published one at a time, in sequence order, so
//! the sequences the dead-letter shard sees never skip.

use std::collections::BTreeSet;

use bytes::Bytes;
use felix_hot::Appended;
use felix_meta::model::Group;
use felix_wire::groups::dead_letter_headers as h;
use felix_wire::protocol::AckMode;
use felix_wire::{BatchBuilder, Compression, Header, Record};
use tracing::warn;

use super::GroupShard;
use super::cursor::{Cursor, Event};
use super::duty::BrokerDuty;
use crate::broker::Broker;
use crate::publish::Publisher;

/// Most records dead-lettered in one pass (the rest wait for the next).
const PER_PASS: usize = 64;

/// Dead-letters (or retires) the cursor's exhausted records. Returns the ticket of the last
/// retirement to await before answering; failures are logged and retried on the next pass.
pub(crate) async fn settle(
    broker: &Broker,
    gs: &GroupShard,
    group: &Group,
    c: &mut Cursor,
    now_ms: i64,
) -> Option<Appended> {
    let max = group.settings.max_attempts;
    let exhausted: Vec<u64> = c
        .progress
        .pending
        .iter()
        .filter(|(_, e)| e.exhausted(max, now_ms))
        .map(|(o, _)| *o)
        .take(PER_PASS)
        .collect();
    if exhausted.is_empty() {
        return None;
    }
    let Some(dlq) = &group.settings.dead_letter else {
        let events = exhausted
            .into_iter()
            .map(|offset| Event::Retire { offset })
            .collect();
        let n = c.progress.pending.len();
        let ticket = gs.record(&group.name, c, events).await;
        broker.node.metrics.group_dead_lettered(
            &gs.key,
            &group.name,
            (n - c.progress.pending.len()) as u64,
        );
        return ticket
            .map_err(|e| warn!(error = %e, "could not retire records"))
            .ok();
    };
    match publish_all(broker, gs, group, dlq, c, &exhausted).await {
        Ok(t) => t,
        Err(e) => {
            warn!(shard = %gs.key, group = group.name, dead_letter = dlq, error = %e,
                "dead-lettering failed; retrying at the next poll");
            None
        }
    }
}

async fn publish_all(
    broker: &Broker,
    gs: &GroupShard,
    group: &Group,
    dlq: &str,
    c: &mut Cursor,
    exhausted: &[u64],
) -> Result<Option<Appended>, felix_wire::protocol::ErrorBody> {
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
    let wanted: BTreeSet<u64> = exhausted.iter().copied().collect();
    let mut records = broker.read_records_at(gs, &wanted).await?;
    let mut last = None;
    for &offset in exhausted {
        let Some(entry) = c.progress.pending.get(&offset).cloned() else {
            continue;
        };
        let (dshard, seq) = match entry.dead_letter {
            Some(begun) => begun,
            None => {
                let dshard = gs.key.shard % shards;
                let seq = c.progress.sequences.get(&dshard).copied().unwrap_or(0);
                let t = gs
                    .record(
                        &group.name,
                        c,
                        vec![Event::DeadLetterBegin {
                            offset,
                            shard: dshard,
                            seq,
                        }],
                    )
                    .await?;
                gs.written(t).await?;
                (dshard, seq)
            }
        };
        if let Some(r) = records.remove(&offset) {
            let batch = dead_letter_batch(gs, group, offset, entry.attempts, &entry.reason, r)
                .producer(producer, epoch, seq)
                .build()
                .map_err(|e| {
                    crate::errors::err(
                        felix_wire::protocol::codes::INTERNAL,
                        "internal",
                        e.to_string(),
                    )
                })?;
            let duty = BrokerDuty::DeadLetter {
                tenant: gs.key.tenant.clone(),
                namespace: gs.key.namespace.clone(),
                stream: gs.key.stream.clone(),
                group: group.name.clone(),
            };
            broker
                .publish_for(
                    Publisher::client(None),
                    Some(duty),
                    (dt, dn, ds, dshard),
                    AckMode::Commit,
                    Bytes::from(batch),
                )
                .await?;
        }
        // Published (or removed by retention meanwhile: nothing to copy).
        last = Some(
            gs.record(&group.name, c, vec![Event::Retire { offset }])
                .await?,
        );
        broker
            .node
            .metrics
            .group_dead_lettered(&gs.key, &group.name, 1);
    }
    Ok(last)
}

/// The dead-letter copy: the record's key, payload and timestamp, the headers naming where
/// it came from and why, then its own headers.
fn dead_letter_batch(
    gs: &GroupShard,
    group: &Group,
    offset: u64,
    attempts: u32,
    reason: &Option<String>,
    r: Record,
) -> BatchBuilder {
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
    BatchBuilder::new(Compression::None).with(Record {
        offset: 0,
        timestamp: r.timestamp,
        key: r.key,
        value: r.value,
        headers,
    })
}
