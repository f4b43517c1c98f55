//! One group's progress on one shard: which records are claimed, by whom and until when,
//! which wait for redelivery, how often each was handed out, and what is retired.
//!
//! Decides nothing by itself about I/O: every change is an [`Event`], applied here the same
//! way when it happens and when the journal is replayed after a restart, so the progress in
//! memory is always the journal's replay. The invariant: an offset below `next` that is not
//! in `pending` is retired (acknowledged, dead-lettered, or skipped as removed by
//! retention) and is never handed out again; an offset in `pending` carries the number of
//! times it was handed out, written before the record was.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use felix_wire::groups::{ClaimRef, GroupShardInfo, reasons};
use felix_wire::protocol::{ErrorBody, codes};
use serde::{Deserialize, Serialize};

/// Now, in the milliseconds since the Unix epoch that deadlines are kept in (wall clock:
/// a claim's deadline survives a restart).
pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Who holds a pending record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "hold", rename_all = "snake_case")]
pub(crate) enum Hold {
    /// Handed to `consumer` until `deadline_ms`; after it, due for redelivery. The name is
    /// shared by every record of a claim, not copied for each.
    Claimed {
        #[serde(with = "shared_name")]
        consumer: Arc<str>,
        deadline_ms: i64,
    },
    /// Released by a nack: due for redelivery from `not_before_ms`.
    Released { not_before_ms: i64 },
}

/// A shared name written and read as a plain string.
mod shared_name {
    use std::sync::Arc;

    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(name: &Arc<str>, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(name)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Arc<str>, D::Error> {
        Ok(Arc::from(String::deserialize(d)?))
    }
}

/// A record handed out at least once and not retired.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Pending {
    /// Deliveries so far (1 after the first).
    pub attempts: u32,
    pub hold: Hold,
    /// The last nack's reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Set once dead-lettering began: the dead-letter shard and the producer sequence its
    /// copy was (or is being) published with, so a retry publishes the same batch and the
    /// dead-letter shard's leader recognises it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead_letter: Option<(u32, i32)>,
    /// Rejected by its holder (a Kafka share consumer's REJECT): dead-lettered whatever
    /// its attempts, never handed out again.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub rejected: bool,
}

impl Pending {
    /// Whether it may be handed out (or dead-lettered) now.
    pub(crate) fn due(&self, now_ms: i64) -> bool {
        match &self.hold {
            Hold::Claimed { deadline_ms, .. } => *deadline_ms <= now_ms,
            Hold::Released { not_before_ms } => *not_before_ms <= now_ms,
        }
    }

    /// Whether it has had its last delivery and is to be dead-lettered: its last claim
    /// lapsed or was nacked (a nack with a delay does not wait it out).
    pub(crate) fn exhausted(&self, max_attempts: u32, now_ms: i64) -> bool {
        self.dead_letter.is_some()
            || self.rejected
            || (self.attempts >= max_attempts
                && (matches!(self.hold, Hold::Released { .. }) || self.due(now_ms)))
    }
}

/// What the journal keeps of a group on a shard (and what a snapshot holds).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Progress {
    /// The next offset never handed out; `None` until the start position is resolved.
    pub next: Option<u64>,
    pub pending: BTreeMap<u64, Pending>,
    pub acked: u64,
    pub dead_lettered: u64,
    /// The idempotent producer dead letters are published with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub producer: Option<(i64, i16)>,
    /// Dead-letter shard → the next sequence of `producer` there.
    #[serde(default)]
    pub sequences: BTreeMap<u32, i32>,
}

/// A change to a group's progress on a shard: the unit of the journal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "e", rename_all = "snake_case")]
pub(crate) enum Event {
    /// Nothing below `to` is to be handed out (the start position; retention removed it).
    Skip {
        to: u64,
    },
    /// Records handed to `consumer` until `deadline_ms`, each with its attempt number;
    /// `next` is the new read position.
    Claim {
        consumer: String,
        deadline_ms: i64,
        records: Vec<(u64, u32)>,
        next: u64,
    },
    Ack {
        offsets: Vec<u64>,
    },
    Release {
        offsets: Vec<u64>,
        not_before_ms: i64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    Extend {
        offsets: Vec<u64>,
        deadline_ms: i64,
    },
    /// Records their holder will not process: dead-lettered next, whatever their attempts.
    Reject {
        offsets: Vec<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    Producer {
        id: i64,
        epoch: i16,
    },
    /// Dead-lettering of `offset` began as sequence `seq` on dead-letter shard `shard`.
    DeadLetterBegin {
        offset: u64,
        shard: u32,
        seq: i32,
    },
    /// `offset` was dead-lettered (or retired without a dead-letter stream) and counted.
    Retire {
        offset: u64,
    },
    /// The whole progress (compaction).
    Snapshot {
        progress: Progress,
    },
    /// The group has seen nothing at or past `to`: the shard's log ends at `to` on a new
    /// leader (a Leader stream's failover lost the records the old leader had past it, and
    /// those offsets will hold other records), or a Kafka share group's start offset was
    /// altered back to `to` (followed by a `Skip` to it: `share_positions.rs`).
    Rewind {
        to: u64,
    },
}

/// A group's progress on a shard, and who was seen lately (memory only).
#[derive(Debug, Default)]
pub(crate) struct Cursor {
    /// The group's id in the control plane: progress of an older group of the same name
    /// is never taken for this one's.
    pub id: u64,
    pub progress: Progress,
    pub seen: HashMap<String, i64>,
    /// No pending record falls due, nor is to be dead-lettered, before this time (ms since
    /// the epoch), so a poll before it need not walk the pending records (thousands with
    /// many consumers, walked under the cursor's lock). Set by [`Cursor::rescan`]; every
    /// event that may bring a record's time forward lowers it, or resets it to 0 (walk
    /// them), as a new or replayed cursor has it.
    pub quiet_until: i64,
    /// Taken by a dead-letter pass for the whole pass, publish included, while the cursor's
    /// lock is let go during the publish (`dead_letter.rs`): passes of the group on this
    /// shard take turns. Taken before the cursor's lock, never while holding it.
    pub dead_lettering: Arc<tokio::sync::Mutex<()>>,
}

/// How long a consumer counts as seen after its last request.
const SEEN_FOR_MS: i64 = 60_000;

impl Cursor {
    pub(crate) fn new(id: u64) -> Cursor {
        Cursor {
            id,
            ..Cursor::default()
        }
    }

    /// Applies one event (live or replayed).
    pub(crate) fn apply(&mut self, event: &Event) {
        self.quiet_until = match event {
            Event::Claim { deadline_ms, .. } | Event::Extend { deadline_ms, .. } => {
                self.quiet_until.min(*deadline_ms)
            }
            // Only take records away.
            Event::Ack { .. } | Event::Retire { .. } | Event::Producer { .. } => self.quiet_until,
            // A release (due at once for a last attempt), a reject, a dead letter begun, or
            // a new progress: walk the records again.
            _ => 0,
        };
        let p = &mut self.progress;
        match event {
            Event::Skip { to } => {
                p.pending.retain(|o, _| o >= to);
                p.next = Some(p.next.unwrap_or(0).max(*to));
            }
            Event::Claim {
                consumer,
                deadline_ms,
                records,
                next,
            } => {
                let consumer: Arc<str> = Arc::from(consumer.as_str());
                let claimed = |attempt: u32| Pending {
                    attempts: attempt,
                    hold: Hold::Claimed {
                        consumer: Arc::clone(&consumer),
                        deadline_ms: *deadline_ms,
                    },
                    reason: None,
                    dead_letter: None,
                    rejected: false,
                };
                // Records never handed out (a fresh stored batch), no fewer than those
                // pending: built as a map of their own in one pass and put after the
                // pending ones (`append` moves both), instead of a search and an insert
                // each.
                if p.pending.len() <= records.len() && past_pending(&p.pending, records) {
                    let mut fresh: BTreeMap<u64, Pending> =
                        records.iter().map(|&(o, a)| (o, claimed(a))).collect();
                    p.pending.append(&mut fresh);
                } else {
                    for (offset, attempt) in records {
                        let entry = p.pending.entry(*offset).or_insert(Pending {
                            attempts: 0,
                            hold: Hold::Released { not_before_ms: 0 },
                            reason: None,
                            dead_letter: None,
                            rejected: false,
                        });
                        entry.attempts = *attempt;
                        entry.hold = Hold::Claimed {
                            consumer: Arc::clone(&consumer),
                            deadline_ms: *deadline_ms,
                        };
                    }
                }
                p.next = Some(p.next.unwrap_or(0).max(*next));
            }
            Event::Ack { offsets } => {
                let mut i = 0;
                while i < offsets.len() {
                    // A run of consecutive offsets from at or below the first pending one
                    // (the oldest claims answered, as a share consumer answers them) is
                    // split off whole; any other offset is looked up on its own.
                    let mut j = i;
                    while j + 1 < offsets.len() && offsets[j + 1] == offsets[j].wrapping_add(1) {
                        j += 1;
                    }
                    let first_pending = p.pending.first_key_value().map(|(k, _)| *k);
                    if j > i
                        && first_pending.is_some_and(|f| offsets[i] <= f)
                        && let Some(end) = offsets[j].checked_add(1)
                    {
                        let rest = p.pending.split_off(&end);
                        p.acked += p.pending.len() as u64;
                        p.pending = rest;
                    } else {
                        for o in &offsets[i..=j] {
                            if p.pending.remove(o).is_some() {
                                p.acked += 1;
                            }
                        }
                    }
                    i = j + 1;
                }
            }
            Event::Release {
                offsets,
                not_before_ms,
                reason,
            } => {
                for o in offsets {
                    if let Some(e) = p.pending.get_mut(o) {
                        e.hold = Hold::Released {
                            not_before_ms: *not_before_ms,
                        };
                        e.reason = reason.clone();
                    }
                }
            }
            Event::Extend {
                offsets,
                deadline_ms,
            } => {
                for o in offsets {
                    if let Some(Pending {
                        hold: Hold::Claimed { deadline_ms: d, .. },
                        ..
                    }) = p.pending.get_mut(o)
                    {
                        *d = *deadline_ms;
                    }
                }
            }
            Event::Reject { offsets, reason } => {
                for o in offsets {
                    if let Some(e) = p.pending.get_mut(o) {
                        e.hold = Hold::Released { not_before_ms: 0 };
                        e.reason = reason.clone();
                        e.rejected = true;
                    }
                }
            }
            Event::Producer { id, epoch } => {
                p.producer = Some((*id, *epoch));
                p.sequences.clear();
            }
            Event::DeadLetterBegin { offset, shard, seq } => {
                if let Some(e) = p.pending.get_mut(offset) {
                    e.dead_letter = Some((*shard, *seq));
                }
                let next = p.sequences.entry(*shard).or_insert(0);
                *next = (*next).max(seq.wrapping_add(1));
            }
            Event::Retire { offset } => {
                if p.pending.remove(offset).is_some() {
                    p.dead_lettered += 1;
                }
            }
            Event::Snapshot { progress } => self.progress = progress.clone(),
            Event::Rewind { to } => {
                p.pending.retain(|o, _| o < to);
                p.next = p.next.map(|n| n.min(*to));
            }
        }
    }

    /// When the earliest pending record falls due (its claim's deadline or its release
    /// time), noted as [`Cursor::quiet_until`]; that is 0 while a record is to be
    /// dead-lettered already (it waits for no time).
    pub(crate) fn rescan(&mut self, max_attempts: u32, now_ms: i64) -> Option<i64> {
        let mut earliest: Option<i64> = None;
        let mut settle_now = false;
        for e in self.progress.pending.values() {
            let at = match &e.hold {
                Hold::Claimed { deadline_ms, .. } => *deadline_ms,
                Hold::Released { not_before_ms } => *not_before_ms,
            };
            earliest = Some(earliest.map_or(at, |t| t.min(at)));
            settle_now |= e.exhausted(max_attempts, now_ms);
        }
        self.quiet_until = if settle_now {
            0
        } else {
            earliest.unwrap_or(i64::MAX)
        };
        earliest
    }

    /// Notes a consumer's request.
    pub(crate) fn saw(&mut self, consumer: &str, now_ms: i64) {
        if self.seen.len() > 1024 {
            self.seen.retain(|_, t| now_ms - *t < SEEN_FOR_MS);
        }
        self.seen.insert(consumer.to_owned(), now_ms);
    }

    /// Checks that `consumer` holds `claim` now: the answer to it may be applied.
    /// `Ok(false)`: the record is retired already (a re-sent answer), nothing to apply.
    pub(crate) fn holds(
        &self,
        consumer: &str,
        claim: &ClaimRef,
        now_ms: i64,
    ) -> Result<bool, ErrorBody> {
        self.check(
            consumer,
            claim,
            self.progress.pending.get(&claim.offset),
            now_ms,
        )
    }

    /// The offsets of `claims` whose answer may be applied (those [`Cursor::holds`] says
    /// `Ok(true)` for), or the first claim's error that is not held. Claims in ascending
    /// offset order (as a Kafka acknowledgement names them) are checked in one walk over
    /// the pending records instead of a lookup each.
    pub(crate) fn held_offsets(
        &self,
        consumer: &str,
        claims: &[ClaimRef],
        now_ms: i64,
    ) -> Result<Vec<u64>, ErrorBody> {
        let mut out = Vec::with_capacity(claims.len());
        let ascending = claims.windows(2).all(|w| w[0].offset < w[1].offset);
        let (Some(first), Some(last), true) = (claims.first(), claims.last(), ascending) else {
            for claim in claims {
                if self.holds(consumer, claim, now_ms)? {
                    out.push(claim.offset);
                }
            }
            return Ok(out);
        };
        let mut pending = self
            .progress
            .pending
            .range(first.offset..=last.offset)
            .peekable();
        for claim in claims {
            while pending.next_if(|(o, _)| **o < claim.offset).is_some() {}
            let entry = pending
                .peek()
                .filter(|(o, _)| **o == claim.offset)
                .map(|(_, e)| *e);
            if self.check(consumer, claim, entry, now_ms)? {
                out.push(claim.offset);
            }
        }
        Ok(out)
    }

    /// [`Cursor::holds`] for `claim`, whose pending entry (if any) is `entry`.
    fn check(
        &self,
        consumer: &str,
        claim: &ClaimRef,
        entry: Option<&Pending>,
        now_ms: i64,
    ) -> Result<bool, ErrorBody> {
        let p = &self.progress;
        let Some(entry) = entry else {
            if p.next.is_some_and(|n| claim.offset < n) {
                return Ok(false);
            }
            return Err(not_claimed(claim));
        };
        match &entry.hold {
            Hold::Claimed {
                consumer: c,
                deadline_ms,
            } if **c == *consumer && entry.attempts == claim.attempt => {
                if *deadline_ms > now_ms && entry.dead_letter.is_none() {
                    Ok(true)
                } else {
                    Err(expired(claim))
                }
            }
            _ if claim.attempt < entry.attempts => Err(expired(claim)),
            _ => Err(not_claimed(claim)),
        }
    }

    /// Everything below this offset is retired: the group's position on the shard.
    pub(crate) fn position(&self) -> u64 {
        let p = &self.progress;
        p.pending
            .keys()
            .next()
            .copied()
            .unwrap_or(p.next.unwrap_or(0))
    }

    /// The progress as `describe` shows it; `end` is the shard's readable end.
    pub(crate) fn info(&self, shard: u32, end: u64, now_ms: i64) -> GroupShardInfo {
        let p = &self.progress;
        let next = p.next.unwrap_or(0);
        let in_flight = p.pending.values().filter(|e| !e.due(now_ms)).count() as u64;
        let mut consumers: Vec<String> = self
            .seen
            .iter()
            .filter(|(_, t)| now_ms - **t < SEEN_FOR_MS)
            .map(|(c, _)| c.clone())
            .collect();
        consumers.sort();
        GroupShardInfo {
            shard,
            acked_up_to: self.position(),
            next_offset: next,
            in_flight,
            waiting: p.pending.len() as u64 - in_flight,
            backlog: end.saturating_sub(next),
            acked: p.acked,
            dead_lettered: p.dead_lettered,
            consumers,
        }
    }
}

/// Whether `records` are in ascending offset order, all past every pending record (none of
/// them pending yet): a claim of records never handed out.
fn past_pending(pending: &BTreeMap<u64, Pending>, records: &[(u64, u32)]) -> bool {
    let after = pending.last_key_value().map(|(k, _)| *k);
    records
        .first()
        .is_some_and(|(o, _)| after.is_none_or(|a| *o > a))
        && records.windows(2).all(|w| w[0].0 < w[1].0)
}

fn expired(claim: &ClaimRef) -> ErrorBody {
    ErrorBody::new(
        codes::CLAIM_NOT_HELD,
        reasons::CLAIM_EXPIRED,
        format!(
            "the claim on offset {} (attempt {}) lapsed: the record is due for redelivery or \
             was handed out again",
            claim.offset, claim.attempt
        ),
    )
}

pub(super) fn not_claimed(claim: &ClaimRef) -> ErrorBody {
    ErrorBody::new(
        codes::CLAIM_NOT_HELD,
        reasons::NOT_CLAIMED,
        format!(
            "offset {} (attempt {}) is not claimed by this consumer",
            claim.offset, claim.attempt
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(c: &mut Cursor, consumer: &str, offsets: &[(u64, u32)], deadline: i64, next: u64) {
        c.apply(&Event::Claim {
            consumer: consumer.into(),
            deadline_ms: deadline,
            records: offsets.to_vec(),
            next,
        });
    }

    #[test]
    fn claims_and_acks_of_whole_runs_leave_what_one_record_at_a_time_leaves() {
        // A pseudo-random mix: fresh batches claimed whole, redeliveries, acks of runs from
        // the oldest claim, from the middle, with gaps, and of records not pending.
        let mut seed = 7u64;
        let mut rand = |n: u64| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) % n
        };
        let (mut whole, mut single) = (Cursor::new(1), Cursor::new(1));
        let mut next = 0u64;
        for step in 0..400 {
            let event = match rand(4) {
                0 | 1 => {
                    let n = 1 + rand(40);
                    let mut records: Vec<(u64, u32)> = Vec::new();
                    if rand(3) == 0
                        && let Some(o) = whole.progress.pending.keys().next().copied()
                    {
                        records.push((o, whole.progress.pending[&o].attempts + 1));
                    }
                    records.extend((next..next + n).map(|o| (o, 1)));
                    next += n;
                    Event::Claim {
                        consumer: format!("c{}", rand(2)),
                        deadline_ms: step,
                        records,
                        next,
                    }
                }
                _ => {
                    let from = match whole.progress.pending.keys().next() {
                        Some(first) if rand(2) == 0 => first.saturating_sub(rand(3)),
                        _ => rand(next + 1),
                    };
                    let offsets: Vec<u64> = (from..from + 1 + rand(30))
                        .filter(|_| rand(8) != 0)
                        .collect();
                    Event::Ack { offsets }
                }
            };
            whole.apply(&event);
            // The same event one record at a time.
            match &event {
                Event::Claim {
                    consumer,
                    deadline_ms,
                    records,
                    next,
                } => {
                    for r in records {
                        claim(&mut single, consumer, &[*r], *deadline_ms, *next);
                    }
                }
                Event::Ack { offsets } => {
                    for o in offsets {
                        single.apply(&Event::Ack { offsets: vec![*o] });
                    }
                }
                _ => unreachable!(),
            }
            assert_eq!(whole.progress, single.progress, "after {event:?}");
        }
        assert!(whole.progress.acked > 100, "acks were applied");
    }

    #[test]
    fn a_rewind_forgets_what_lies_past_the_new_end_and_keeps_the_rest() {
        let mut c = Cursor::new(1);
        c.apply(&Event::Skip { to: 0 });
        claim(&mut c, "a", &[(4, 2), (5, 1), (6, 1)], 100, 7);
        c.apply(&Event::Rewind { to: 5 });
        assert_eq!(c.progress.pending.keys().copied().collect::<Vec<_>>(), [4]);
        assert_eq!(c.progress.pending[&4].attempts, 2);
        assert_eq!(c.progress.next, Some(5));
        // Nothing past the position: nothing changes.
        c.apply(&Event::Rewind { to: 9 });
        assert_eq!(c.progress.next, Some(5));
    }

    #[test]
    fn only_the_holder_within_its_deadline_may_answer() {
        let mut c = Cursor::new(1);
        c.apply(&Event::Skip { to: 10 });
        claim(&mut c, "a", &[(10, 1), (11, 1)], 100, 12);
        let r = |offset, attempt| ClaimRef { offset, attempt };
        assert_eq!(c.holds("a", &r(10, 1), 50), Ok(true));
        let reason = |e: ErrorBody| e.reason;
        assert_eq!(
            c.holds("b", &r(10, 1), 50).map_err(reason),
            Err("not_claimed_by_you".into())
        );
        assert_eq!(
            c.holds("a", &r(10, 1), 100).map_err(reason),
            Err("claim_expired".into())
        );
        assert_eq!(
            c.holds("a", &r(12, 1), 50).map_err(reason),
            Err("not_claimed_by_you".into())
        );
        // Lapsed and handed to b as attempt 2: a's answer is to an expired claim.
        claim(&mut c, "b", &[(10, 2)], 300, 12);
        assert_eq!(
            c.holds("a", &r(10, 1), 150).map_err(reason),
            Err("claim_expired".into())
        );
        c.apply(&Event::Ack { offsets: vec![10] });
        // A re-sent ack of a retired record is answered without applying anything.
        assert_eq!(c.holds("b", &r(10, 2), 150), Ok(false));
        assert_eq!(c.progress.acked, 1);
    }

    #[test]
    fn many_claims_checked_in_one_walk_answer_as_one_by_one() {
        let mut c = Cursor::new(1);
        c.apply(&Event::Skip { to: 10 });
        claim(&mut c, "a", &[(10, 1), (11, 1), (13, 1), (14, 2)], 100, 15);
        claim(&mut c, "b", &[(12, 1)], 100, 15);
        c.apply(&Event::Ack { offsets: vec![11] });
        let r = |offset, attempt| ClaimRef { offset, attempt };
        let one_by_one = |claims: &[ClaimRef], now| {
            let mut out = Vec::new();
            for claim in claims {
                if c.holds("a", claim, now)? {
                    out.push(claim.offset);
                }
            }
            Ok::<_, ErrorBody>(out)
        };
        for claims in [
            vec![r(10, 1), r(11, 1), r(13, 1), r(14, 2)],
            vec![r(14, 2), r(10, 1)],
            vec![r(10, 1), r(12, 1), r(13, 1)],
            vec![r(10, 1), r(14, 1)],
            vec![r(13, 1), r(15, 1)],
            vec![r(9, 1), r(10, 1)],
        ] {
            for now in [50, 100] {
                assert_eq!(
                    c.held_offsets("a", &claims, now),
                    one_by_one(&claims, now),
                    "{claims:?} at {now}"
                );
            }
        }
        assert_eq!(
            c.held_offsets("a", &[r(10, 1), r(11, 1), r(13, 1), r(14, 2)], 50),
            Ok(vec![10, 13, 14]),
            "11 is retired already: nothing to apply"
        );
    }

    #[test]
    fn replaying_events_gives_the_same_progress_as_a_snapshot() {
        let mut live = Cursor::new(1);
        let events = vec![
            Event::Skip { to: 0 },
            Event::Claim {
                consumer: "a".into(),
                deadline_ms: 10,
                records: vec![(0, 1), (1, 1), (2, 1)],
                next: 3,
            },
            Event::Ack { offsets: vec![0] },
            Event::Release {
                offsets: vec![1],
                not_before_ms: 5,
                reason: Some("bad".into()),
            },
            Event::Producer { id: 7, epoch: 0 },
            Event::DeadLetterBegin {
                offset: 1,
                shard: 0,
                seq: 0,
            },
            Event::Retire { offset: 1 },
        ];
        for e in &events {
            live.apply(e);
        }
        let mut replayed = Cursor::new(1);
        replayed.apply(&Event::Snapshot {
            progress: live.progress.clone(),
        });
        assert_eq!(replayed.progress, live.progress);
        assert_eq!(live.progress.pending.keys().collect::<Vec<_>>(), vec![&2]);
        assert_eq!((live.progress.acked, live.progress.dead_lettered), (1, 1));
        assert_eq!(live.progress.sequences.get(&0), Some(&1));
        let info = live.info(0, 10, 0);
        assert_eq!((info.acked_up_to, info.in_flight, info.backlog), (2, 1, 7));
    }

    #[test]
    fn quiet_until_is_never_later_than_the_first_record_a_poll_must_see() {
        let mut c = Cursor::new(1);
        assert_eq!(c.quiet_until, 0, "a new cursor walks its records");
        c.apply(&Event::Skip { to: 0 });
        claim(&mut c, "a", &[(0, 1), (1, 1)], 100, 2);
        assert_eq!(c.rescan(5, 10), Some(100));
        assert_eq!(c.quiet_until, 100);
        claim(&mut c, "a", &[(2, 1)], 300, 3);
        assert_eq!(c.quiet_until, 100, "a later claim keeps it");
        c.apply(&Event::Extend {
            offsets: vec![2],
            deadline_ms: 40,
        });
        assert_eq!(c.quiet_until, 40, "a shorter extend brings it forward");
        c.apply(&Event::Ack { offsets: vec![2] });
        assert_eq!(c.quiet_until, 40, "an ack only takes records away");
        c.apply(&Event::Release {
            offsets: vec![1],
            not_before_ms: 500,
            reason: None,
        });
        assert_eq!(c.quiet_until, 0, "a release is walked at the next poll");
        // Record 1 was nacked on its last attempt (max 1): to be dead-lettered now.
        assert_eq!(c.rescan(1, 10), Some(100));
        assert_eq!(c.quiet_until, 0);
        assert_eq!(c.rescan(5, 10), Some(100));
        assert_eq!(c.quiet_until, 100);
        c.apply(&Event::Ack { offsets: vec![0] });
        c.apply(&Event::Retire { offset: 1 });
        assert_eq!(c.rescan(5, 10), None);
        assert_eq!(
            c.quiet_until,
            i64::MAX,
            "nothing pending: nothing falls due"
        );
    }

    #[test]
    fn a_record_is_exhausted_after_its_last_delivery_lapses_or_is_nacked() {
        let p = Pending {
            attempts: 3,
            hold: Hold::Claimed {
                consumer: "a".into(),
                deadline_ms: 10,
            },
            reason: None,
            dead_letter: None,
            rejected: false,
        };
        assert!(!p.exhausted(3, 5));
        assert!(p.exhausted(3, 10));
        assert!(!p.exhausted(4, 10));
        let nacked = Pending {
            hold: Hold::Released { not_before_ms: 99 },
            ..p
        };
        assert!(nacked.exhausted(3, 5));
        let rejected = Pending {
            attempts: 1,
            rejected: true,
            ..nacked
        };
        assert!(
            rejected.exhausted(3, 5),
            "a rejected record is dead-lettered at once"
        );
    }
}
