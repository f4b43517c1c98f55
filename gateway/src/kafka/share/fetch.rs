//! ShareFetch: the acknowledgements it carries, then records acquired for the member.
//!
//! Decides what one ShareFetch answers and when: first its acknowledgements are applied
//! (each partition's outcome in `acknowledge_error_code`), then every partition of the
//! session is polled through the Felix group (records due for redelivery first, then new
//! ones). `max_records` is one budget for all the partitions, as on Kafka, and a soft
//! limit: new records are acquired in whole stored batches, no batch is started once the
//! budget is spent, and a batch started is taken whole, so the records acquired stay within
//! `max_records` but for the one batch that crosses it. The partitions are worked on at
//! once, a task each: their groups' states, locks and journals are the partitions' own, so
//! a fetch of several partitions waits for the slowest, not for the sum. The answer goes out once any record is acquired, or when
//! `max_wait_ms` (at most [`MAX_WAIT`]) has passed; meanwhile the request waits for a
//! partition's end to move, and looks again every [`RECHECK`] for locks that lapsed. Each
//! partition's answer carries the stored batches holding its acquired records and the
//! acquired ranges with their delivery counts; a client delivers only the acquired
//! records, as with Kafka. Session epoch -1 closes the session: its acknowledgements are
//! applied, every record still held is released, and nothing is fetched.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use felix_meta::auth::Action;
use felix_wire::groups::ClaimedMeta;
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::share_fetch_response::{
    AcquiredRecords, PartitionData, ShareFetchableTopicResponse,
};
use kafka_protocol::messages::{ShareFetchRequest, ShareFetchResponse};
use tokio::time::Instant;
use uuid::Uuid;

use super::acknowledge::{Batch, Target, apply, release_all};
use super::session::{Held, HeldRecords, Partition};
use super::{sb, topic_by_id};
use crate::groups::answers::MAX_ANSWER_RECORDS;
use crate::groups::poll::{Budget, MAX_POLL_RECORDS, Poll};
use crate::kafka::Kafka;
use crate::kafka::errors::kafka_error;
use crate::kafka::scope::{On, Scope};
use crate::shard::shard_key;

/// The longest a ShareFetch waits for records.
const MAX_WAIT: Duration = Duration::from_secs(30);
/// How often a waiting fetch looks again without a new record (a lock may have lapsed).
const RECHECK: Duration = Duration::from_millis(200);
/// The most record bytes one answer carries.
const MAX_RESPONSE_BYTES: usize = 64 << 20;

/// Rotates the partition polled first, so a busy partition does not starve the others.
static ROTATION: AtomicUsize = AtomicUsize::new(0);

/// One partition's answer being built.
#[derive(Default)]
struct Answer {
    error: Option<(ResponseError, String)>,
    ack_error: Option<(ResponseError, String)>,
    acked: bool,
    records: Vec<bytes::Bytes>,
    acquired: Vec<ClaimedMeta>,
}

fn refused(e: ResponseError, m: String) -> ShareFetchResponse {
    ShareFetchResponse::default()
        .with_error_code(e.code())
        .with_error_message(Some(sb(&m)))
}

/// ShareFetch.
pub async fn share_fetch(
    kafka: &Kafka,
    scope: &Scope,
    request: ShareFetchRequest,
) -> ShareFetchResponse {
    let group = request.group_id.as_ref().map(|g| g.to_string());
    let member = request.member_id.as_ref().map(|m| m.to_string());
    let (Some(group), Some(member)) = (group, member) else {
        return refused(
            ResponseError::InvalidRequest,
            "a share fetch names its group and member".into(),
        );
    };
    if let Err(e) = scope.allow(kafka, Action::GroupConsume, &group, On::Group) {
        return refused(e, format!("not allowed to consume as share group {group}"));
    }
    let session = kafka.share_sessions.of(&scope.group_key(&group), &member);
    let mut session = session.lock().await;
    let epoch = request.share_session_epoch;
    if let Err(e) = session.begin(epoch) {
        return refused(e, format!("share session epoch {epoch}"));
    }
    session.prune(crate::groups::now_ms());
    let mut answers: std::collections::BTreeMap<Partition, Answer> = Default::default();
    let mut names: std::collections::HashMap<Uuid, Option<String>> = Default::default();
    let mut name_of = |id: Uuid| {
        names
            .entry(id)
            .or_insert_with(|| topic_by_id(kafka, scope, id).map(|(n, _)| n))
            .clone()
    };
    // Acknowledgements first, and the session's partitions updated. Each partition's are
    // applied by a task of its own, all at once (their journals are the partitions'), the
    // records it holds there taken out of the session meanwhile and put back after.
    let mut acks: Vec<AckWork> = Vec::new();
    for t in request.topics {
        let name = name_of(t.topic_id);
        for p in t.partitions {
            let key = (t.topic_id, p.partition_index);
            if epoch != -1 {
                session.partitions.insert(key);
            }
            if p.acknowledgement_batches.is_empty() {
                continue;
            }
            let a = answers.entry(key).or_default();
            a.acked = true;
            let Some(topic) = &name else {
                a.ack_error = Some((ResponseError::UnknownTopicId, "unknown topic id".into()));
                continue;
            };
            if let Err(e) = scope.allow(kafka, Action::GroupConsume, topic, On::Topic) {
                a.ack_error = Some((e, format!("not allowed to consume topic {topic}")));
                continue;
            }
            let batches = p.acknowledgement_batches.into_iter().map(|b| Batch {
                first: b.first_offset,
                last: b.last_offset,
                types: b.acknowledge_types,
            });
            // A partition named twice has its batches applied together.
            if let Some(w) = acks.iter_mut().find(|w| w.key == key) {
                w.batches.extend(batches);
                continue;
            }
            acks.push(AckWork {
                key,
                topic: topic.clone(),
                batches: batches.collect(),
                held: session.held.remove(&key).unwrap_or_default(),
            });
        }
    }
    let applying = acks.into_iter().map(|mut w| {
        let broker = kafka.broker.clone();
        let (tenant, namespace) = (scope.tenant.clone(), scope.namespace.clone());
        let (group, member) = (group.clone(), member.clone());
        tokio::spawn(async move {
            let to = Target {
                broker: &broker,
                tenant: &tenant,
                namespace: &namespace,
                group: &group,
                member: &member,
                topic: &w.topic,
                shard: w.key.1.max(0) as u32,
            };
            let outcome = apply(&to, &w.batches, &mut w.held).await;
            (w.key, w.held, outcome)
        })
    });
    for done in futures::future::join_all(applying).await {
        match done {
            Ok((key, held, outcome)) => {
                session.held.insert(key, held);
                if let Err(refusal) = outcome {
                    answers.entry(key).or_default().ack_error = Some(refusal);
                }
            }
            // A task that panicked: its partition's records are forgotten by the session
            // (their locks lapse and they are redelivered), and the member told.
            Err(e) => tracing::warn!(error = %e, "a share acknowledgement task failed"),
        }
    }
    for f in &request.forgotten_topics_data {
        for p in &f.partitions {
            session.partitions.remove(&(f.topic_id, *p));
        }
    }
    let mut lock_ms = super::DEFAULT_LOCK_DURATION_MS;
    if epoch == -1 {
        release_all(kafka, scope, &group, &member, &mut session).await;
    } else if request.max_records > 0 {
        let partitions: Vec<(Partition, Option<String>)> = session
            .partitions
            .iter()
            .map(|k| (*k, name_of(k.0)))
            .collect();
        let want = Want {
            group: &group,
            member: &member,
            max_records: request.max_records as usize,
            max_bytes: match request.max_bytes {
                n if n <= 0 => MAX_RESPONSE_BYTES,
                n => (n as usize).min(MAX_RESPONSE_BYTES),
            },
            wait: Duration::from_millis(request.max_wait_ms.max(0) as u64).min(MAX_WAIT),
        };
        lock_ms = acquire(kafka, scope, &want, &partitions, &mut answers).await;
        for (key, a) in &answers {
            let held = session.held.entry(*key).or_default();
            // Consecutive records acquired alike (a stored batch) are noted as one run.
            let mut i = 0;
            while i < a.acquired.len() {
                let c = &a.acquired[i];
                let mut j = i;
                while let Some(n) = a.acquired.get(j + 1)
                    && n.offset == a.acquired[j].offset + 1
                    && (n.attempt, n.deadline_ms) == (c.attempt, c.deadline_ms)
                {
                    j += 1;
                }
                let as_held = Held {
                    attempt: c.attempt,
                    deadline_ms: c.deadline_ms,
                };
                held.insert_run(c.offset, a.acquired[j].offset, as_held);
                i = j + 1;
            }
        }
    }
    response(answers, lock_ms)
}

/// One partition's acknowledgements, applied by a task of their own.
struct AckWork {
    key: Partition,
    topic: String,
    batches: Vec<Batch>,
    held: HeldRecords,
}

/// What a fetch asks for.
struct Want<'a> {
    group: &'a str,
    member: &'a str,
    max_records: usize,
    max_bytes: usize,
    wait: Duration,
}

/// Polls the session's partitions until records are acquired or the wait is over;
/// returns the shortest lock among the groups polled. Each round polls its partitions at
/// once, a task each (their groups' states are the partitions', on their own locks),
/// drawing on one budget of `max_records` (a stored batch is started only while some is
/// left, and taken whole) and `max_bytes` shared out evenly; with fewer records asked for
/// than partitions, only that many are polled. The polls start from a rotating partition,
/// so when one batch spends the budget, the next fetch starts elsewhere and none starves.
async fn acquire(
    kafka: &Kafka,
    scope: &Scope,
    want: &Want<'_>,
    partitions: &[(Partition, Option<String>)],
    answers: &mut std::collections::BTreeMap<Partition, Answer>,
) -> u64 {
    let deadline = Instant::now() + want.wait;
    let (t, n) = (&scope.tenant, &scope.namespace);
    let mut lock_ms = u64::MAX;
    let start = ROTATION.fetch_add(1, Ordering::Relaxed);
    // `max_records` over all partitions, as Kafka counts it: a partition's poll starts no
    // stored batch once it is spent, so only one batch can take the answer past it.
    let budget = Arc::new(Budget::new(want.max_records));
    loop {
        let mut watches = Vec::new();
        let mut polled: Vec<(Partition, String, u32)> = Vec::new();
        for i in 0..partitions.len() {
            let ((topic_id, partition), name) = &partitions[(start + i) % partitions.len()];
            let key = (*topic_id, *partition);
            let Some(topic) = name else {
                answers.entry(key).or_default().error =
                    Some((ResponseError::UnknownTopicId, "unknown topic id".into()));
                continue;
            };
            if let Err(e) = scope.allow(kafka, Action::GroupConsume, topic, On::Topic) {
                answers.entry(key).or_default().error =
                    Some((e, format!("not allowed to consume topic {topic}")));
                continue;
            }
            if let Ok(g) = kafka.broker.group(t, n, topic, want.group) {
                lock_ms = lock_ms.min(g.settings.visibility_timeout_ms);
            }
            let shard = (*partition).max(0) as u32;
            if let Ok(rx) = kafka
                .broker
                .watch_high_watermark(&shard_key(t, n, topic, shard))
            {
                watches.push(rx);
            }
            if polled.len() < want.max_records {
                polled.push((key, topic.clone(), shard));
            }
        }
        let share = polled.len().max(1);
        let records = want.max_records.clamp(1, MAX_POLL_RECORDS as usize) as u32;
        let bytes = (want.max_bytes / share).max(1) as u64;
        let polls = polled.into_iter().map(|(key, topic, shard)| {
            let budget = budget.clone();
            let broker = kafka.broker.clone();
            let (tenant, namespace) = (t.clone(), n.clone());
            let (group, member) = (want.group.to_owned(), want.member.to_owned());
            tokio::spawn(async move {
                let poll = Poll {
                    tenant: &tenant,
                    namespace: &namespace,
                    stream: &topic,
                    group: &group,
                    shard,
                    consumer: &member,
                    max_records: records,
                    max_bytes: bytes,
                    wait_ms: 0,
                    whole_batches: Some(MAX_ANSWER_RECORDS),
                    shared: Some(&budget),
                };
                (key, broker.group_poll(&poll).await)
            })
        });
        let mut got = 0usize;
        for done in futures::future::join_all(polls).await {
            let (key, outcome) = match done {
                Ok(done) => done,
                Err(e) => {
                    tracing::warn!(error = %e, "a share fetch's poll task failed");
                    continue;
                }
            };
            match outcome {
                Ok(claimed) if !claimed.records.is_empty() => {
                    got += claimed.records.len();
                    let a = answers.entry(key).or_default();
                    a.acquired.extend(claimed.records);
                    a.records.push(claimed.body);
                }
                Ok(_) => {}
                Err(e) => {
                    answers.entry(key).or_default().error = Some((kafka_error(&e), e.message));
                }
            }
        }
        let failed = answers.values().any(|a| a.error.is_some());
        if got > 0 || failed || watches.is_empty() || Instant::now() >= deadline {
            return if lock_ms == u64::MAX {
                super::DEFAULT_LOCK_DURATION_MS
            } else {
                lock_ms
            };
        }
        let wake = deadline.min(Instant::now() + RECHECK);
        let changed =
            futures::future::select_all(watches.iter_mut().map(|w| Box::pin(w.changed())));
        let _ = tokio::time::timeout_at(wake, changed).await;
    }
}

/// The acquired records of a partition as Kafka's ranges: consecutive offsets with the same
/// delivery count.
fn ranges(acquired: &[ClaimedMeta]) -> Vec<AcquiredRecords> {
    let mut sorted: Vec<&ClaimedMeta> = acquired.iter().collect();
    sorted.sort_by_key(|c| c.offset);
    let mut out: Vec<AcquiredRecords> = Vec::new();
    for c in sorted {
        let count = i16::try_from(c.attempt).unwrap_or(i16::MAX);
        match out.last_mut() {
            Some(r) if r.last_offset + 1 == c.offset as i64 && r.delivery_count == count => {
                r.last_offset += 1;
            }
            _ => out.push(
                AcquiredRecords::default()
                    .with_first_offset(c.offset as i64)
                    .with_last_offset(c.offset as i64)
                    .with_delivery_count(count),
            ),
        }
    }
    out
}

fn response(
    answers: std::collections::BTreeMap<Partition, Answer>,
    lock_ms: u64,
) -> ShareFetchResponse {
    let mut topics: Vec<ShareFetchableTopicResponse> = Vec::new();
    for ((topic_id, partition), a) in answers {
        if a.error.is_none() && !a.acked && a.acquired.is_empty() {
            continue;
        }
        let mut p = PartitionData::default()
            .with_partition_index(partition)
            .with_acquired_records(ranges(&a.acquired))
            .with_records(Some(match &a.records[..] {
                [] => bytes::Bytes::new(),
                [one] => one.clone(),
                many => bytes::Bytes::from(many.concat()),
            }));
        if let Some((e, m)) = a.error {
            p = p.with_error_code(e.code()).with_error_message(Some(sb(&m)));
        }
        if let Some((e, m)) = a.ack_error {
            p = p
                .with_acknowledge_error_code(e.code())
                .with_acknowledge_error_message(Some(sb(&m)));
        }
        match topics.last_mut() {
            Some(t) if t.topic_id == topic_id => t.partitions.push(p),
            _ => topics.push(
                ShareFetchableTopicResponse::default()
                    .with_topic_id(topic_id)
                    .with_partitions(vec![p]),
            ),
        }
    }
    ShareFetchResponse::default()
        .with_acquisition_lock_timeout_ms(i32::try_from(lock_ms).unwrap_or(i32::MAX))
        .with_responses(topics)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acquired_records_merge_into_ranges_by_delivery_count() {
        let c = |offset, attempt| ClaimedMeta {
            offset,
            attempt,
            deadline_ms: 0,
        };
        let r = ranges(&[c(7, 2), c(3, 1), c(4, 1), c(5, 2), c(6, 2), c(9, 1)]);
        let got: Vec<(i64, i64, i16)> = r
            .iter()
            .map(|r| (r.first_offset, r.last_offset, r.delivery_count))
            .collect();
        assert_eq!(got, vec![(3, 4, 1), (5, 7, 2), (9, 9, 1)]);
    }
}
