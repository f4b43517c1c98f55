//! Acknowledgements: Kafka's acknowledgement batches as Felix answers, and ShareAcknowledge.
//!
//! Decides what each acknowledgement type does to a record the member holds: ACCEPT acks
//! it (retired for good), RELEASE nacks it without delay (redelivered to any member, with
//! its delivery count plus one; its last permitted delivery released goes to the dead
//! letters), REJECT dead-letters it now (to the group's dead-letter stream if it has one,
//! else archived and counted, as Kafka does), GAP names an offset that is no record and
//! changes nothing. The invariants: a batch that is malformed (offsets backwards, a type
//! count that fits neither one-for-all nor one-per-offset, an unknown type) is refused
//! whole with `INVALID_REQUEST` and changes nothing; an acknowledgement for a record this
//! member does not hold now (never acquired, lock lapsed) changes nothing for that record
//! and is answered `INVALID_RECORD_STATE`, while the partition's other acknowledgements
//! are applied; and every applied one is in the group journal before it is answered.

use std::collections::BTreeMap;

use felix_meta::auth::Action;
use felix_wire::groups::ClaimRef;
use felix_wire::protocol::codes;
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::share_acknowledge_response::{
    PartitionData, ShareAcknowledgeTopicResponse,
};
use kafka_protocol::messages::{ShareAcknowledgeRequest, ShareAcknowledgeResponse};

use super::session::{HeldRecords, Session};
use super::{sb, topic_by_id};
use crate::broker::Broker;
use crate::groups::answers::{Answer, Answering, MAX_ANSWER_RECORDS};
use crate::kafka::Kafka;
use crate::kafka::errors::kafka_error;
use crate::kafka::scope::{On, Scope};

const GAP: i8 = 0;
const ACCEPT: i8 = 1;
const RELEASE: i8 = 2;
const REJECT: i8 = 3;

/// The reason a rejected record's dead letter carries (`felix-dlq-reason`).
const REJECTED: &str = "rejected by a Kafka share consumer";

/// One acknowledgement batch, as both request types carry it.
pub(super) struct Batch {
    pub first: i64,
    pub last: i64,
    pub types: Vec<i8>,
}

/// Where acknowledgements go: the Felix group `group` on the stream `topic` of the
/// namespace, partition `shard`, answered as `member`.
pub(super) struct Target<'a> {
    pub broker: &'a Broker,
    pub tenant: &'a str,
    pub namespace: &'a str,
    pub group: &'a str,
    pub member: &'a str,
    pub topic: &'a str,
    pub shard: u32,
}

/// A partition's acknowledgement error: the Kafka code and a message.
pub(super) type Refusal = (ResponseError, String);

/// The offsets each type names, checked; nothing is applied if any batch is malformed.
fn expand(batches: &[Batch]) -> Result<BTreeMap<i8, Vec<u64>>, Refusal> {
    let bad = |m: String| (ResponseError::InvalidRequest, m);
    let mut by_type: BTreeMap<i8, Vec<u64>> = BTreeMap::new();
    let mut total = 0usize;
    for b in batches {
        if b.first < 0 || b.last < b.first {
            return Err(bad(format!(
                "acknowledgement batch {}..={} is not a range of offsets",
                b.first, b.last
            )));
        }
        let n = (b.last - b.first + 1) as u64;
        total = total.saturating_add(n as usize);
        if total > MAX_ANSWER_RECORDS {
            return Err(bad(format!(
                "at most {MAX_ANSWER_RECORDS} acknowledgements per partition and request"
            )));
        }
        if b.types.len() != 1 && b.types.len() as u64 != n {
            return Err(bad(format!(
                "acknowledgement batch {}..={} has {} types: one, or one per offset",
                b.first,
                b.last,
                b.types.len()
            )));
        }
        for (i, offset) in (b.first as u64..=b.last as u64).enumerate() {
            let t = if b.types.len() == 1 {
                b.types[0]
            } else {
                b.types[i]
            };
            if !(GAP..=REJECT).contains(&t) {
                return Err(bad(format!("unknown acknowledgement type {t}")));
            }
            by_type.entry(t).or_default().push(offset);
        }
    }
    by_type.remove(&GAP);
    Ok(by_type)
}

/// Applies a partition's acknowledgement batches to the records the member holds there.
pub(super) async fn apply(
    to: &Target<'_>,
    batches: &[Batch],
    held: &mut HeldRecords,
) -> Result<(), Refusal> {
    let by_type = expand(batches)?;
    let mut not_held = Vec::new();
    for (t, offsets) in by_type {
        let mut claims = Vec::with_capacity(offsets.len());
        // Runs of consecutive offsets (a batch of one type is one) taken out at once.
        let mut i = 0;
        while i < offsets.len() {
            let mut j = i;
            while j + 1 < offsets.len() && offsets[j + 1] == offsets[j] + 1 {
                j += 1;
            }
            held.take_run(offsets[i], offsets[j], &mut claims, &mut not_held);
            i = j + 1;
        }
        if claims.is_empty() {
            continue;
        }
        let answer = || match t {
            ACCEPT => Answer::Ack,
            RELEASE => Answer::Nack {
                delay_ms: 0,
                reason: None,
            },
            _ => Answer::Reject {
                reason: Some(REJECTED.to_owned()),
            },
        };
        not_held.extend(answer_claims(to, &claims, answer).await?);
    }
    if not_held.is_empty() {
        return Ok(());
    }
    not_held.sort_unstable();
    Err((
        ResponseError::InvalidRecordState,
        format!(
            "{} acknowledgement(s) for records this member does not hold (lock lapsed or \
             never acquired), first offset {}: not applied",
            not_held.len(),
            not_held[0]
        ),
    ))
}

/// Answers `claims`; returns the offsets whose claim was no longer held (not applied).
/// Refused whole when one claim lapsed, the answer is retried record by record so the
/// others still apply.
async fn answer_claims(
    to: &Target<'_>,
    claims: &[ClaimRef],
    answer: impl Fn() -> Answer,
) -> Result<Vec<u64>, Refusal> {
    let answering = |records| Answering {
        tenant: to.tenant,
        namespace: to.namespace,
        stream: to.topic,
        group: to.group,
        shard: to.shard,
        consumer: to.member,
        records,
    };
    let refused = |e: felix_wire::protocol::ErrorBody| (kafka_error(&e), e.message);
    match to.broker.group_answer(&answering(claims), answer()).await {
        Ok(_) => return Ok(Vec::new()),
        Err(e) if e.code == codes::CLAIM_NOT_HELD => {}
        Err(e) => return Err(refused(e)),
    }
    let mut lapsed = Vec::new();
    for c in claims {
        match to
            .broker
            .group_answer(&answering(std::slice::from_ref(c)), answer())
            .await
        {
            Ok(_) => {}
            Err(e) if e.code == codes::CLAIM_NOT_HELD => lapsed.push(c.offset),
            Err(e) => return Err(refused(e)),
        }
    }
    Ok(lapsed)
}

/// Releases every record the session holds (a closed session), as Kafka does when a
/// member leaves; failures (a lock that lapsed meanwhile) change nothing.
pub(super) async fn release_all(
    kafka: &Kafka,
    scope: &Scope,
    group: &str,
    member: &str,
    session: &mut Session,
) {
    for ((topic_id, partition), held) in std::mem::take(&mut session.held) {
        let Some((topic, _)) = topic_by_id(kafka, scope, topic_id) else {
            continue;
        };
        let claims: Vec<ClaimRef> = held
            .iter()
            .map(|(offset, h)| ClaimRef {
                offset,
                attempt: h.attempt,
            })
            .collect();
        let to = Target {
            broker: &kafka.broker,
            tenant: &scope.tenant,
            namespace: &scope.namespace,
            group,
            member,
            topic: &topic,
            shard: partition as u32,
        };
        for chunk in claims.chunks(MAX_ANSWER_RECORDS) {
            let release = || Answer::Nack {
                delay_ms: 0,
                reason: None,
            };
            if let Err((_, message)) = answer_claims(&to, chunk, release).await {
                tracing::debug!(
                    group,
                    member,
                    topic,
                    error = message,
                    "could not release a closed share session's records"
                );
            }
        }
    }
}

/// ShareAcknowledge: acknowledgements outside a fetch (a commit, or a close with -1).
pub async fn share_acknowledge(
    kafka: &Kafka,
    scope: &Scope,
    request: ShareAcknowledgeRequest,
) -> ShareAcknowledgeResponse {
    let refused = |e: ResponseError, m: String| {
        ShareAcknowledgeResponse::default()
            .with_error_code(e.code())
            .with_error_message(Some(sb(&m)))
    };
    let group = request.group_id.as_ref().map(|g| g.to_string());
    let member = request.member_id.as_ref().map(|m| m.to_string());
    let (Some(group), Some(member)) = (group, member) else {
        return refused(
            ResponseError::InvalidRequest,
            "a share acknowledgement names its group and member".into(),
        );
    };
    if let Err(e) = scope.allow(kafka, Action::GroupConsume, &group, On::Group) {
        return refused(e, format!("not allowed to consume as share group {group}"));
    }
    if request.share_session_epoch == 0 {
        return refused(
            ResponseError::InvalidShareSessionEpoch,
            "a share acknowledgement is sent in an open session (epoch > 0) or closes it (-1)"
                .into(),
        );
    }
    let session = kafka.share_sessions.of(&scope.group_key(&group), &member);
    let mut session = session.lock().await;
    if let Err(e) = session.begin(request.share_session_epoch) {
        return refused(
            e,
            format!("share session epoch {}", request.share_session_epoch),
        );
    }
    session.prune(crate::groups::now_ms());
    let mut responses = Vec::new();
    for t in request.topics {
        let name = topic_by_id(kafka, scope, t.topic_id).map(|(n, _)| n);
        let mut partitions = Vec::new();
        for p in t.partitions {
            let base = PartitionData::default().with_partition_index(p.partition_index);
            let outcome = match &name {
                None => Err((ResponseError::UnknownTopicId, "unknown topic id".to_owned())),
                Some(topic) => match scope.allow(kafka, Action::GroupConsume, topic, On::Topic) {
                    Err(e) => Err((e, format!("not allowed to consume topic {topic}"))),
                    Ok(()) => {
                        let batches: Vec<Batch> = p
                            .acknowledgement_batches
                            .into_iter()
                            .map(|b| Batch {
                                first: b.first_offset,
                                last: b.last_offset,
                                types: b.acknowledge_types,
                            })
                            .collect();
                        let to = Target {
                            broker: &kafka.broker,
                            tenant: &scope.tenant,
                            namespace: &scope.namespace,
                            group: &group,
                            member: &member,
                            topic,
                            shard: p.partition_index.max(0) as u32,
                        };
                        let held = session
                            .held
                            .entry((t.topic_id, p.partition_index))
                            .or_default();
                        apply(&to, &batches, held).await
                    }
                },
            };
            partitions.push(match outcome {
                Ok(()) => base,
                Err((e, m)) => base
                    .with_error_code(e.code())
                    .with_error_message(Some(sb(&m))),
            });
        }
        responses.push(
            ShareAcknowledgeTopicResponse::default()
                .with_topic_id(t.topic_id)
                .with_partitions(partitions),
        );
    }
    if request.share_session_epoch == -1 {
        release_all(kafka, scope, &group, &member, &mut session).await;
    }
    ShareAcknowledgeResponse::default().with_responses(responses)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(first: i64, last: i64, types: &[i8]) -> Batch {
        Batch {
            first,
            last,
            types: types.to_vec(),
        }
    }

    #[test]
    fn batches_expand_to_offsets_by_type_and_gaps_change_nothing() {
        let by = expand(&[batch(10, 12, &[1]), batch(13, 16, &[2, 0, 3, 1])]).expect("valid");
        assert_eq!(by[&ACCEPT], vec![10, 11, 12, 16]);
        assert_eq!(by[&RELEASE], vec![13]);
        assert_eq!(by[&REJECT], vec![15]);
        assert!(!by.contains_key(&GAP));
    }

    #[test]
    fn malformed_batches_are_refused_whole() {
        for bad in [
            vec![batch(5, 4, &[1])],
            vec![batch(-1, 2, &[1])],
            vec![batch(0, 2, &[1, 1])],
            vec![batch(0, 0, &[9])],
            vec![batch(0, 0, &[1]), batch(0, 20_000, &[1])],
        ] {
            let (e, _) = expand(&bad).expect_err("refused");
            assert_eq!(e, ResponseError::InvalidRequest);
        }
    }
}
