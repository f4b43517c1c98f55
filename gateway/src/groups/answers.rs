//! A consumer's answers to its claims: ack (retire for good), nack (release now or after a
//! delay), extend (hold longer), reject (dead-letter now: a Kafka share consumer's REJECT).
//!
//! Decides when an answer is taken: only from the consumer that holds the claim, for the
//! attempt it was handed, before its deadline. The invariants: an answer with any claim not
//! held is refused whole (`claim_expired` or `not_claimed_by_you`) and changes nothing; an
//! answer taken is in the journal before it is answered ok, so an acknowledged record is
//! never handed out again, across restarts too; a re-sent ack of a record already retired
//! is answered ok and changes nothing.

use felix_wire::groups::ClaimRef;
use felix_wire::protocol::{ErrorBody, codes};

use super::cursor::Event;
use super::now_ms;
use crate::broker::Broker;
use crate::errors::err;

/// Most records one answer names.
pub const MAX_ANSWER_RECORDS: usize = 10_000;
/// Longest nack delay: the longest visibility timeout.
const MAX_DELAY_MS: u64 = felix_meta::model::MAX_VISIBILITY_TIMEOUT_MS;
/// Longest nack reason kept (it travels in the dead letter's headers).
const MAX_REASON_LEN: usize = 1024;

/// What a consumer answers.
pub(crate) enum Answer {
    Ack,
    Nack {
        delay_ms: u64,
        reason: Option<String>,
    },
    Extend {
        visibility_ms: Option<u64>,
    },
    /// Not to be processed by anyone: dead-lettered now, whatever its attempts.
    Reject {
        reason: Option<String>,
    },
}

/// Who answers what.
pub(crate) struct Answering<'a> {
    pub tenant: &'a str,
    pub namespace: &'a str,
    pub stream: &'a str,
    pub group: &'a str,
    pub shard: u32,
    pub consumer: &'a str,
    pub records: &'a [ClaimRef],
}

fn invalid(message: String) -> ErrorBody {
    err(codes::INVALID_ARGUMENT, "invalid_argument", message)
}

impl Broker {
    /// Applies an answer; for an extend, returns each record's new deadline.
    pub(crate) async fn group_answer(
        &self,
        a: &Answering<'_>,
        answer: Answer,
    ) -> Result<Vec<i64>, ErrorBody> {
        super::poll::check_consumer(a.consumer)?;
        if a.records.is_empty() || a.records.len() > MAX_ANSWER_RECORDS {
            return Err(invalid(format!(
                "an answer names 1..={MAX_ANSWER_RECORDS} records"
            )));
        }
        match &answer {
            Answer::Nack { delay_ms, .. } if *delay_ms > MAX_DELAY_MS => {
                return Err(invalid(format!("delay_ms must be at most {MAX_DELAY_MS}")));
            }
            Answer::Nack { reason, .. } | Answer::Reject { reason }
                if reason.as_ref().is_some_and(|r| r.len() > MAX_REASON_LEN) =>
            {
                return Err(invalid(format!(
                    "a nack reason is at most {MAX_REASON_LEN} bytes"
                )));
            }
            Answer::Extend {
                visibility_ms: Some(v),
            } if *v == 0 || *v > MAX_DELAY_MS => {
                return Err(invalid(format!("visibility_ms must be 1..={MAX_DELAY_MS}")));
            }
            _ => {}
        }
        let group = self
            .group_confirmed(a.tenant, a.namespace, a.stream, a.group)
            .await?;
        let gs = self
            .group_shard(a.tenant, a.namespace, a.stream, a.shard)
            .await?;
        let mut c = gs.cursor(&group).await;
        let now = now_ms();
        c.saw(a.consumer, now);
        let mut offsets = c.held_offsets(a.consumer, a.records, now)?;
        offsets.sort_unstable();
        offsets.dedup();
        // A retired record (acknowledged, dead-lettered) is held by no one: a re-sent ack
        // or nack of it changes nothing and is answered ok, but an extend would answer a
        // deadline for a claim that no longer exists. Refused whole, changing nothing.
        if matches!(answer, Answer::Extend { .. })
            && let Some(retired) = a
                .records
                .iter()
                .find(|r| offsets.binary_search(&r.offset).is_err())
        {
            return Err(super::cursor::not_claimed(retired));
        }
        let visibility = group.settings.visibility_timeout_ms;
        let (event, deadlines) = match &answer {
            Answer::Ack => (Event::Ack { offsets }, Vec::new()),
            Answer::Nack { delay_ms, reason } => (
                Event::Release {
                    offsets,
                    not_before_ms: now + *delay_ms as i64,
                    reason: reason.clone(),
                },
                Vec::new(),
            ),
            Answer::Reject { reason } => (
                Event::Reject {
                    offsets,
                    reason: reason.clone(),
                },
                Vec::new(),
            ),
            Answer::Extend { visibility_ms } => {
                let deadline_ms = now + visibility_ms.unwrap_or(visibility) as i64;
                (
                    Event::Extend {
                        offsets,
                        deadline_ms,
                    },
                    vec![deadline_ms; a.records.len()],
                )
            }
        };
        let acked = match &event {
            Event::Ack { offsets } => offsets.len() as u64,
            _ => 0,
        };
        let ticket = gs.record(&group.name, &mut c, vec![event]).await?;
        drop(c);
        gs.written(ticket).await?;
        // A nack of a record's last delivery, or a reject, dead-letters it now, before the
        // answer, not at the next poll.
        if matches!(answer, Answer::Nack { .. } | Answer::Reject { .. }) {
            super::dead_letter::settle(self, &gs, &group, true).await;
        }
        self.node.metrics.group_acked(&gs.key, &group.name, acked);
        Ok(deadlines)
    }
}
