//! Compact binary headers for the consumer groups' hot requests (poll, ack, nack, extend)
//! and their answers (`claimed`, `answered`), `features::BINARY_GROUP_HEADERS`
//! (docs/protocol.md), in place of the JSON header. Management (create, alter, describe,
//! list, delete) and `commit` stay JSON.
//!
//! Why: a poll's answer names every claimed record (offset, attempt, deadline) and an ack
//! names every record it answers; as JSON of an internally tagged enum that header was
//! buffered field by field before it was read, ~12% of the broker's and ~15% of the client's
//! CPU with one consumer acknowledging 1 KiB records (bench/results/groups-22c.md). Here the
//! records go as runs (consecutive offsets with the same attempt, and in an answer the same
//! deadline), so a poll of 100 records from one stored batch is one run of 24 bytes.
//!
//! Which encoding a header is in is told by its first byte: JSON starts with `{`, the
//! cache's binary headers with `binary::TAG`, these with [`TAG`]. A broker answers a binary
//! group request with a binary answer when it has one (errors stay JSON), and a client sends
//! them only to a broker that agreed to the feature, so an older broker never sees one.
//!
//! Layout (integers big-endian; a string is `[len u16][UTF-8]`; runs are `[n u32]` then
//! `n` runs):
//! * request: `[TAG][op u8][flags u8][tenant][namespace][stream][group][consumer]
//!   [shard u32]`, then by op: poll `[max_records u32][max_bytes u64][wait_ms u64]`; ack
//!   `[runs]`; nack `[runs][delay_ms u64]` and `[reason]` if flag `REASON`; extend `[runs]`
//!   and `[visibility_ms u64]` if flag `VISIBILITY`. A run is `[first offset u64][count
//!   u32][attempt u32]`: the records `first .. first + count`, each at that attempt.
//! * answer: `[TAG][answer u8][shard u32]`, then claimed `[runs]` whose runs also carry
//!   `[deadline_ms i64]`; answered `[n u32][deadline_ms i64] × n`.
//!
//! Invariant: decoding accepts exactly these layouts and gives back the message encoded,
//! record for record in order: unknown ops, answers or flags, a run of no records or past
//! the last offset, more than [`MAX_NAMED_RECORDS`] records, bytes missing or left over, or a
//! string that is not UTF-8 are each a [`FrameError::BadHeader`] naming what is wrong, never
//! a panic. A message that does not fit (a name over 16 bits, too many records) has no
//! binary form and goes as JSON.

use crate::binary_codec::{Reader, bad_in, json, put_str};
use crate::frame::FrameError;
use crate::groups::{ClaimRef, ClaimedMeta, GroupRequest, GroupResponse};
use crate::protocol::{Request, Response};

/// First byte of a binary group header (the cache's is `binary::TAG`, JSON's `{`).
pub const TAG: u8 = 0xB2;

/// Most records one binary header may name: far above what a poll claims (500) or an
/// answer may name (10,000), so a count that large is damage, refused before any memory is
/// taken for it.
pub const MAX_NAMED_RECORDS: u64 = 1 << 16;

const LABEL: &str = "binary group header";

const OP_POLL: u8 = 1;
const OP_ACK: u8 = 2;
const OP_NACK: u8 = 3;
const OP_EXTEND: u8 = 4;

const ANSWER_CLAIMED: u8 = 1;
const ANSWER_ANSWERED: u8 = 2;

const FLAG_REASON: u8 = 1 << 0;
const FLAG_VISIBILITY: u8 = 1 << 1;

/// Whether a frame's header is a binary group header.
pub fn is_binary(header: &[u8]) -> bool {
    header.first() == Some(&TAG)
}

fn bad(what: impl std::fmt::Display) -> FrameError {
    bad_in(LABEL, what)
}

/// Consecutive offsets with the same attempt (and `extra`: a claim's deadline), in order.
fn runs<T: Copy, E: PartialEq + Copy>(
    items: &[T],
    key: impl Fn(&T) -> (u64, u32, E),
) -> Vec<(u64, u32, u32, E)> {
    let mut out: Vec<(u64, u32, u32, E)> = Vec::new();
    for item in items {
        let (offset, attempt, extra) = key(item);
        if let Some(last) = out.last_mut() {
            let (first, count, a, e) = *last;
            if a == attempt
                && e == extra
                && count < u32::MAX
                && first.checked_add(u64::from(count)) == Some(offset)
            {
                last.1 += 1;
                continue;
            }
        }
        out.push((offset, 1, attempt, extra));
    }
    out
}

fn put_claim_runs(out: &mut Vec<u8>, records: &[ClaimRef]) -> Option<()> {
    if records.len() as u64 > MAX_NAMED_RECORDS {
        return None;
    }
    let runs = runs(records, |r| (r.offset, r.attempt, ()));
    out.extend_from_slice(&u32::try_from(runs.len()).ok()?.to_be_bytes());
    for (first, count, attempt, ()) in runs {
        out.extend_from_slice(&first.to_be_bytes());
        out.extend_from_slice(&count.to_be_bytes());
        out.extend_from_slice(&attempt.to_be_bytes());
    }
    Some(())
}

/// The binary header of a poll, ack, nack or extend; `None` for any other group request
/// or one that does not fit (those go as JSON).
pub fn encode_request(request: &GroupRequest) -> Option<Vec<u8>> {
    let (group, shard, consumer, op, flags) = match request {
        GroupRequest::Poll {
            group,
            shard,
            consumer,
            ..
        } => (group, shard, consumer, OP_POLL, 0),
        GroupRequest::Ack {
            group,
            shard,
            consumer,
            ..
        } => (group, shard, consumer, OP_ACK, 0),
        GroupRequest::Nack {
            group,
            shard,
            consumer,
            reason,
            ..
        } => {
            let flags = if reason.is_some() { FLAG_REASON } else { 0 };
            (group, shard, consumer, OP_NACK, flags)
        }
        GroupRequest::Extend {
            group,
            shard,
            consumer,
            visibility_ms,
            ..
        } => {
            let flags = if visibility_ms.is_some() {
                FLAG_VISIBILITY
            } else {
                0
            };
            (group, shard, consumer, OP_EXTEND, flags)
        }
        _ => return None,
    };
    let (tenant, namespace, stream) = request.stream();
    let mut out = Vec::with_capacity(
        3 + 10 + tenant.len() + namespace.len() + stream.len() + group.len() + consumer.len() + 24,
    );
    out.extend_from_slice(&[TAG, op, flags]);
    for s in [tenant, namespace, stream, group, consumer] {
        put_str(&mut out, s)?;
    }
    out.extend_from_slice(&shard.to_be_bytes());
    match request {
        GroupRequest::Poll {
            max_records,
            max_bytes,
            wait_ms,
            ..
        } => {
            out.extend_from_slice(&max_records.to_be_bytes());
            out.extend_from_slice(&max_bytes.to_be_bytes());
            out.extend_from_slice(&wait_ms.to_be_bytes());
        }
        GroupRequest::Ack { records, .. } => put_claim_runs(&mut out, records)?,
        GroupRequest::Nack {
            records,
            delay_ms,
            reason,
            ..
        } => {
            put_claim_runs(&mut out, records)?;
            out.extend_from_slice(&delay_ms.to_be_bytes());
            if let Some(reason) = reason {
                put_str(&mut out, reason)?;
            }
        }
        GroupRequest::Extend {
            records,
            visibility_ms,
            ..
        } => {
            put_claim_runs(&mut out, records)?;
            if let Some(v) = visibility_ms {
                out.extend_from_slice(&v.to_be_bytes());
            }
        }
        _ => return None,
    }
    Some(out)
}

/// The binary header of a `claimed` or `answered` answer; `None` for any other (JSON).
pub fn encode_response(response: &GroupResponse) -> Option<Vec<u8>> {
    match response {
        GroupResponse::Claimed { shard, records } => {
            if records.len() as u64 > MAX_NAMED_RECORDS {
                return None;
            }
            let runs = runs(records, |m| (m.offset, m.attempt, m.deadline_ms));
            let mut out = Vec::with_capacity(10 + runs.len() * 24);
            out.extend_from_slice(&[TAG, ANSWER_CLAIMED]);
            out.extend_from_slice(&shard.to_be_bytes());
            out.extend_from_slice(&u32::try_from(runs.len()).ok()?.to_be_bytes());
            for (first, count, attempt, deadline_ms) in runs {
                out.extend_from_slice(&first.to_be_bytes());
                out.extend_from_slice(&count.to_be_bytes());
                out.extend_from_slice(&attempt.to_be_bytes());
                out.extend_from_slice(&deadline_ms.to_be_bytes());
            }
            Some(out)
        }
        GroupResponse::Answered {
            shard,
            deadlines_ms,
        } => {
            if deadlines_ms.len() as u64 > MAX_NAMED_RECORDS {
                return None;
            }
            let mut out = Vec::with_capacity(10 + deadlines_ms.len() * 8);
            out.extend_from_slice(&[TAG, ANSWER_ANSWERED]);
            out.extend_from_slice(&shard.to_be_bytes());
            out.extend_from_slice(&(deadlines_ms.len() as u32).to_be_bytes());
            for d in deadlines_ms {
                out.extend_from_slice(&d.to_be_bytes());
            }
            Some(out)
        }
        _ => None,
    }
}

/// The runs of a header, expanded in order; `each`: the bytes of a run after its first
/// offset and count, read by `tail`.
fn read_runs<T>(
    r: &mut Reader,
    each: usize,
    mut tail: impl FnMut(&mut Reader) -> Result<(u32, i64), FrameError>,
    make: impl Fn(u64, u32, i64) -> T,
) -> Result<Vec<T>, FrameError> {
    let n = r.u32("run count")? as usize;
    // Checked before anything is taken for them: each run is 12 + `each` bytes.
    if n.saturating_mul(12 + each) > r.left() {
        return Err(bad(format_args!(
            "{n} runs cut short ({} bytes left)",
            r.left()
        )));
    }
    let mut out = Vec::new();
    for _ in 0..n {
        let first = r.u64("run's first offset")?;
        let count = r.u32("run's count")?;
        let (attempt, extra) = tail(r)?;
        if count == 0 {
            return Err(bad("a run of no records"));
        }
        if first.checked_add(u64::from(count) - 1).is_none() {
            return Err(bad(format_args!(
                "a run of {count} from offset {first} passes the last offset"
            )));
        }
        if (out.len() as u64) + u64::from(count) > MAX_NAMED_RECORDS {
            return Err(bad(format_args!(
                "more than {MAX_NAMED_RECORDS} records named"
            )));
        }
        out.extend((0..u64::from(count)).map(|i| make(first + i, attempt, extra)));
    }
    Ok(out)
}

fn claim_refs(r: &mut Reader) -> Result<Vec<ClaimRef>, FrameError> {
    read_runs(
        r,
        4,
        |r| Ok((r.u32("run's attempt")?, 0)),
        |offset, attempt, _| ClaimRef { offset, attempt },
    )
}

fn check_flags(flags: u8, allowed: u8, what: &str) -> Result<(), FrameError> {
    if flags & !allowed != 0 {
        return Err(bad(format_args!("unknown flags {flags:#04x} on {what}")));
    }
    Ok(())
}

/// Reads a binary group request header back into the request it stands for.
pub fn decode_request(header: &[u8]) -> Result<GroupRequest, FrameError> {
    let mut r = Reader::start_tagged(header, TAG, LABEL, "request header")?;
    let op = r.u8("operation")?;
    let flags = r.u8("flags")?;
    if !(OP_POLL..=OP_EXTEND).contains(&op) {
        return Err(bad(format_args!("unknown operation {op}")));
    }
    let tenant = r.string("tenant")?;
    let namespace = r.string("namespace")?;
    let stream = r.string("stream")?;
    let group = r.string("group")?;
    let consumer = r.string("consumer")?;
    let shard = r.u32("shard")?;
    let request = match op {
        OP_POLL => {
            check_flags(flags, 0, "a poll")?;
            GroupRequest::Poll {
                tenant,
                namespace,
                stream,
                group,
                shard,
                consumer,
                max_records: r.u32("max records")?,
                max_bytes: r.u64("max bytes")?,
                wait_ms: r.u64("wait")?,
            }
        }
        OP_ACK => {
            check_flags(flags, 0, "an ack")?;
            GroupRequest::Ack {
                tenant,
                namespace,
                stream,
                group,
                shard,
                consumer,
                records: claim_refs(&mut r)?,
            }
        }
        OP_NACK => {
            check_flags(flags, FLAG_REASON, "a nack")?;
            let records = claim_refs(&mut r)?;
            let delay_ms = r.u64("delay")?;
            let reason = if flags & FLAG_REASON != 0 {
                Some(r.string("reason")?)
            } else {
                None
            };
            GroupRequest::Nack {
                tenant,
                namespace,
                stream,
                group,
                shard,
                consumer,
                records,
                delay_ms,
                reason,
            }
        }
        _ => {
            check_flags(flags, FLAG_VISIBILITY, "an extend")?;
            let records = claim_refs(&mut r)?;
            let visibility_ms = if flags & FLAG_VISIBILITY != 0 {
                Some(r.u64("visibility")?)
            } else {
                None
            };
            GroupRequest::Extend {
                tenant,
                namespace,
                stream,
                group,
                shard,
                consumer,
                records,
                visibility_ms,
            }
        }
    };
    r.end()?;
    Ok(request)
}

/// Reads a binary group answer header back into the answer it stands for.
pub fn decode_response(header: &[u8]) -> Result<GroupResponse, FrameError> {
    let mut r = Reader::start_tagged(header, TAG, LABEL, "answer header")?;
    let answer = r.u8("answer")?;
    let shard = r.u32("shard")?;
    let response = match answer {
        ANSWER_CLAIMED => GroupResponse::Claimed {
            shard,
            records: read_runs(
                &mut r,
                12,
                |r| Ok((r.u32("run's attempt")?, r.u64("run's deadline")? as i64)),
                |offset, attempt, deadline_ms| ClaimedMeta {
                    offset,
                    attempt,
                    deadline_ms,
                },
            )?,
        },
        ANSWER_ANSWERED => {
            let n = r.u32("deadline count")? as usize;
            if n as u64 > MAX_NAMED_RECORDS || n.saturating_mul(8) > r.left() {
                return Err(bad(format_args!(
                    "{n} deadlines cut short or too many ({} bytes left)",
                    r.left()
                )));
            }
            let mut deadlines_ms = Vec::with_capacity(n);
            for _ in 0..n {
                deadlines_ms.push(r.u64("deadline")? as i64);
            }
            GroupResponse::Answered {
                shard,
                deadlines_ms,
            }
        }
        other => return Err(bad(format_args!("unknown answer {other}"))),
    };
    r.end()?;
    Ok(response)
}

/// The header of a request frame: binary for a poll, ack, nack or extend when `binary`
/// (the broker agreed to `BINARY_GROUP_HEADERS`), else JSON.
pub fn request_header(request: &Request, binary: bool) -> Vec<u8> {
    match request {
        Request::Group(op) if binary => encode_request(op).unwrap_or_else(|| json(request)),
        _ => json(request),
    }
}

/// The header of a response frame: binary when `binary` (the request was) and the answer
/// has a binary form, else JSON (errors included).
pub fn response_header(response: &Response, binary: bool) -> Vec<u8> {
    match response {
        Response::Group(answer) if binary => {
            encode_response(answer).unwrap_or_else(|| json(response))
        }
        _ => json(response),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refs(pairs: &[(u64, u32)]) -> Vec<ClaimRef> {
        pairs
            .iter()
            .map(|&(offset, attempt)| ClaimRef { offset, attempt })
            .collect()
    }

    fn every_request() -> Vec<GroupRequest> {
        let names = || {
            (
                "acme".to_string(),
                "prod".to_string(),
                "orders".to_string(),
                "billing".to_string(),
            )
        };
        // Consecutive runs, a gap, a change of attempt, an offset out of order, a repeat.
        let records = refs(&[(10, 1), (11, 1), (12, 1), (20, 1), (21, 2), (5, 1), (5, 1)]);
        let (tenant, namespace, stream, group) = names();
        let mut all = vec![GroupRequest::Poll {
            tenant,
            namespace,
            stream,
            group,
            shard: 3,
            consumer: "c-1".into(),
            max_records: 100,
            max_bytes: 4 << 20,
            wait_ms: 200,
        }];
        let (tenant, namespace, stream, group) = names();
        all.push(GroupRequest::Ack {
            tenant,
            namespace,
            stream,
            group,
            shard: 0,
            consumer: "c-1".into(),
            records: records.clone(),
        });
        for reason in [None, Some("bad payload ü".to_string())] {
            let (tenant, namespace, stream, group) = names();
            all.push(GroupRequest::Nack {
                tenant,
                namespace,
                stream,
                group,
                shard: u32::MAX,
                consumer: String::new(),
                records: refs(&[(u64::MAX, 5)]),
                delay_ms: 1_000,
                reason,
            });
        }
        for visibility_ms in [None, Some(60_000)] {
            let (tenant, namespace, stream, group) = names();
            all.push(GroupRequest::Extend {
                tenant,
                namespace,
                stream,
                group,
                shard: 1,
                consumer: "c".into(),
                records: records.clone(),
                visibility_ms,
            });
        }
        all
    }

    #[test]
    fn hot_requests_and_answers_round_trip_record_for_record() {
        for request in every_request() {
            let header = encode_request(&request).expect("a hot request has a binary header");
            assert!(is_binary(&header) && !crate::binary::is_binary(&header));
            assert_eq!(decode_request(&header).expect("decodes"), request);
            // Through the frame-level reader too.
            assert_eq!(
                crate::binary::read_request(&header).expect("reads"),
                Request::Group(request)
            );
        }
        let claimed = GroupResponse::Claimed {
            shard: 2,
            records: (0..100)
                .map(|i| ClaimedMeta {
                    offset: 1_000 + i,
                    attempt: 1 + (i / 60) as u32,
                    deadline_ms: 1_700_000_000_000,
                })
                .chain([ClaimedMeta {
                    offset: 1_100,
                    attempt: 2,
                    deadline_ms: 5,
                }])
                .collect(),
        };
        let header = encode_response(&claimed).expect("binary");
        // Three runs: attempts 1 and 2 at one deadline, then a new deadline.
        assert_eq!(header.len(), 2 + 4 + 4 + 3 * 24);
        assert_eq!(decode_response(&header).expect("decodes"), claimed);
        for answered in [
            GroupResponse::Answered {
                shard: 1,
                deadlines_ms: vec![],
            },
            GroupResponse::Answered {
                shard: 1,
                deadlines_ms: vec![-1, i64::MAX],
            },
            GroupResponse::Claimed {
                shard: 0,
                records: vec![],
            },
        ] {
            let header = encode_response(&answered).expect("binary");
            assert_eq!(
                crate::binary::read_response(&header).expect("reads"),
                Response::Group(answered)
            );
        }
        // Management, commit and their answers stay JSON.
        let list = GroupRequest::List {
            tenant: "t".into(),
            namespace: "n".into(),
            stream: "s".into(),
        };
        assert_eq!(encode_request(&list), None);
        assert!(request_header(&Request::Group(list), true).starts_with(b"{"));
        let committed = GroupResponse::Committed {
            shard: 0,
            offset: 1,
        };
        assert_eq!(encode_response(&committed), None);
        // Without the feature, JSON.
        let ack = Request::Group(every_request().remove(1));
        assert!(request_header(&ack, false).starts_with(b"{"));
        assert!(request_header(&ack, true).starts_with(&[TAG]));
    }

    fn bad_header(h: &[u8]) -> String {
        match decode_request(h) {
            Err(FrameError::BadHeader(why)) => why,
            other => panic!("{h:?}: expected a bad header, got {other:?}"),
        }
    }

    #[test]
    fn malformed_headers_are_typed_errors() {
        let requests = every_request();
        for request in &requests {
            let header = encode_request(request).expect("encodes");
            for n in 0..header.len() {
                let why = bad_header(&header[..n]);
                assert!(why.starts_with(LABEL), "cut at {n}: {why}");
            }
            let mut long = header.clone();
            long.push(0);
            assert!(bad_header(&long).contains("after the last field"));
        }
        let ack = encode_request(&requests[1]).expect("encodes");
        let mut op = ack.clone();
        op[1] = 9;
        assert!(bad_header(&op).contains("unknown operation 9"));
        let mut flags = ack.clone();
        flags[2] = FLAG_REASON;
        assert!(bad_header(&flags).contains("unknown flags"));
        let mut utf8 = ack.clone();
        utf8[5] = 0xFF;
        assert!(bad_header(&utf8).contains("tenant is not UTF-8"));
        let mut json = ack.clone();
        json[0] = b'{';
        assert!(bad_header(&json).contains("binary tag"));
        // The runs of an ack start after its fixed part: tag, op, flags, five names, shard.
        let names: usize = ["acme", "prod", "orders", "billing", "c-1"]
            .iter()
            .map(|s| 2 + s.len())
            .sum();
        let runs_at = 3 + names + 4;
        let run = |first: u64, count: u32| {
            let mut h = ack[..runs_at].to_vec();
            h.extend_from_slice(&1u32.to_be_bytes());
            h.extend_from_slice(&first.to_be_bytes());
            h.extend_from_slice(&count.to_be_bytes());
            h.extend_from_slice(&1u32.to_be_bytes());
            h
        };
        assert_eq!(
            decode_request(&run(7, 3)).expect("a good run"),
            GroupRequest::Ack {
                tenant: "acme".into(),
                namespace: "prod".into(),
                stream: "orders".into(),
                group: "billing".into(),
                shard: 0,
                consumer: "c-1".into(),
                records: refs(&[(7, 1), (8, 1), (9, 1)]),
            }
        );
        assert!(bad_header(&run(7, 0)).contains("no records"));
        assert!(bad_header(&run(u64::MAX, 2)).contains("passes the last offset"));
        assert!(bad_header(&run(0, u32::MAX)).contains("more than"));
        // A run count far beyond the bytes there is refused before anything is allocated.
        let mut many = ack[..runs_at].to_vec();
        many.extend_from_slice(&u32::MAX.to_be_bytes());
        assert!(bad_header(&many).contains("runs cut short"));

        let answered = encode_response(&GroupResponse::Answered {
            shard: 0,
            deadlines_ms: vec![1],
        })
        .expect("encodes");
        for n in 0..answered.len() {
            assert!(decode_response(&answered[..n]).is_err(), "cut at {n}");
        }
        assert!(matches!(
            decode_response(&[TAG, 77, 0, 0, 0, 0]),
            Err(FrameError::BadHeader(why)) if why.contains("unknown answer 77")
        ));
    }
}
