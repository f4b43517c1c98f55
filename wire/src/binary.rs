//! Compact binary headers for the cache's key operations and their answers
//! (`features::BINARY_CACHE_HEADERS`, docs/protocol.md), in place of the JSON header.
//!
//! Why: a put or a get is a few dozen bytes of header beside its value, yet decoding the
//! JSON header of an internally tagged enum buffers every field before it is read; at tens
//! of thousands of operations a second on both ends that was the largest share of the
//! protocol's own CPU left after QUIC (bench/results/cache.md). This header is read in one
//! pass with no intermediate values.
//!
//! Which encoding a header is in is told by its first byte: a JSON header always starts
//! with `{`, a binary one with [`TAG`]. A broker answers a binary request with a binary
//! answer when the answer has one (`written`, `value`, `deleted`, `counter`) and in JSON
//! otherwise (errors included); a client reads either. A client sends binary headers only
//! to a broker that agreed to the feature, so an older broker never sees one.
//!
//! Layout (integers big-endian; a string is `[len u16][UTF-8]`):
//! * request: `[TAG][op u8][flags u8][tenant][namespace][cache][key]`, then by op: put
//!   `[ttl_ms u64]` if flag `TTL`, `[version u64]` if flag `IF_VERSION`; delete
//!   `[version u64]` if `IF_VERSION`; counter add `[delta i64]`. Flag `IF_ABSENT` makes a
//!   put or delete conditional on absence.
//! * answer: `[TAG][answer u8]`, then written `[version u64]`; value `[flags u8]
//!   [version u64]` and `[ttl_ms u64]` if flag `TTL` (flag `FOUND` when found); deleted
//!   `[existed u8]`; counter `[value i64][version u64]`.
//!
//! Invariant: decoding accepts exactly these layouts: unknown ops, answers or flags, bytes
//! missing or left over, a string that is not UTF-8 or a key over `MAX_KEY_BYTES` are each a
//! [`FrameError::BadHeader`] naming what is wrong, never a panic.

use crate::binary_codec::{Reader, bad_in, json, put_str};
use crate::cache::{CacheRequest, CacheResponse, Condition, MAX_KEY_BYTES};
use crate::frame::FrameError;
use crate::protocol::{Request, Response};

/// First byte of a binary header (a JSON header starts with `{`).
pub const TAG: u8 = 0xB1;

const OP_PUT: u8 = 1;
const OP_GET: u8 = 2;
const OP_DELETE: u8 = 3;
const OP_COUNTER_ADD: u8 = 4;
const OP_COUNTER_GET: u8 = 5;

const ANSWER_WRITTEN: u8 = 1;
const ANSWER_VALUE: u8 = 2;
const ANSWER_DELETED: u8 = 3;
const ANSWER_COUNTER: u8 = 4;

const FLAG_TTL: u8 = 1 << 0;
const FLAG_IF_ABSENT: u8 = 1 << 1;
const FLAG_IF_VERSION: u8 = 1 << 2;
const FLAG_FOUND: u8 = 1 << 1;

/// Whether a frame's header is a binary one.
pub fn is_binary(header: &[u8]) -> bool {
    header.first() == Some(&TAG)
}

fn condition_flags(condition: &Option<Condition>) -> (u8, Option<u64>) {
    match condition {
        None => (0, None),
        Some(Condition::Absent) => (FLAG_IF_ABSENT, None),
        Some(Condition::Version(v)) => (FLAG_IF_VERSION, Some(*v)),
    }
}

/// The binary header of a key operation; `None` for a request that has none (management,
/// watches) or whose names do not fit a length of 16 bits: those go as JSON.
pub fn encode_request(request: &CacheRequest) -> Option<Vec<u8>> {
    let (op, flags, tail): (u8, u8, [Option<u64>; 2]) = match request {
        CacheRequest::Put {
            ttl_ms, condition, ..
        } => {
            let (cond, version) = condition_flags(condition);
            let ttl = if ttl_ms.is_some() { FLAG_TTL } else { 0 };
            (OP_PUT, cond | ttl, [*ttl_ms, version])
        }
        CacheRequest::Get { .. } => (OP_GET, 0, [None, None]),
        CacheRequest::Delete { condition, .. } => {
            let (cond, version) = condition_flags(condition);
            (OP_DELETE, cond, [None, version])
        }
        CacheRequest::CounterAdd { delta, .. } => (OP_COUNTER_ADD, 0, [Some(*delta as u64), None]),
        CacheRequest::CounterGet { .. } => (OP_COUNTER_GET, 0, [None, None]),
        _ => return None,
    };
    let (tenant, namespace, cache) = request.cache();
    let key = request.key()?;
    let mut out =
        Vec::with_capacity(3 + 8 + tenant.len() + namespace.len() + cache.len() + key.len() + 16);
    out.extend_from_slice(&[TAG, op, flags]);
    for s in [tenant, namespace, cache, key] {
        put_str(&mut out, s)?;
    }
    for v in tail.into_iter().flatten() {
        out.extend_from_slice(&v.to_be_bytes());
    }
    Some(out)
}

/// The binary header of an answer; `None` for an answer that has none (it goes as JSON).
pub fn encode_response(response: &CacheResponse) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(2 + 17);
    match response {
        CacheResponse::Written { version } => {
            out.extend_from_slice(&[TAG, ANSWER_WRITTEN]);
            out.extend_from_slice(&version.to_be_bytes());
        }
        CacheResponse::Value {
            found,
            version,
            ttl_ms,
        } => {
            let flags =
                if *found { FLAG_FOUND } else { 0 } | if ttl_ms.is_some() { FLAG_TTL } else { 0 };
            out.extend_from_slice(&[TAG, ANSWER_VALUE, flags]);
            out.extend_from_slice(&version.to_be_bytes());
            if let Some(ttl) = ttl_ms {
                out.extend_from_slice(&ttl.to_be_bytes());
            }
        }
        CacheResponse::Deleted { existed } => {
            out.extend_from_slice(&[TAG, ANSWER_DELETED, u8::from(*existed)]);
        }
        CacheResponse::Counter { value, version } => {
            out.extend_from_slice(&[TAG, ANSWER_COUNTER]);
            out.extend_from_slice(&value.to_be_bytes());
            out.extend_from_slice(&version.to_be_bytes());
        }
        _ => return None,
    }
    Some(out)
}

fn bad(what: impl std::fmt::Display) -> FrameError {
    bad_in(CACHE_LABEL, what)
}

const CACHE_LABEL: &str = "binary cache header";

/// A cache header's reader.
fn start<'a>(buf: &'a [u8], kind: &str) -> Result<Reader<'a>, FrameError> {
    Reader::start_tagged(buf, TAG, CACHE_LABEL, kind)
}

fn check_flags(flags: u8, allowed: u8, what: &str) -> Result<(), FrameError> {
    if flags & !allowed != 0 {
        return Err(bad(format_args!("unknown flags {flags:#04x} on {what}")));
    }
    if flags & FLAG_IF_ABSENT != 0 && flags & FLAG_IF_VERSION != 0 {
        return Err(bad(format_args!(
            "{what} is conditional on both absence and a version"
        )));
    }
    Ok(())
}

/// Reads a binary request header back into the request it stands for.
pub fn decode_request(header: &[u8]) -> Result<CacheRequest, FrameError> {
    let mut r = start(header, "request header")?;
    let op = r.u8("operation")?;
    let flags = r.u8("flags")?;
    let tenant = r.string("tenant")?;
    let namespace = r.string("namespace")?;
    let cache = r.string("cache")?;
    let key = r.string("key")?;
    if key.len() > MAX_KEY_BYTES {
        return Err(bad(format_args!(
            "key of {} bytes over the limit of {MAX_KEY_BYTES}",
            key.len()
        )));
    }
    let condition = |r: &mut Reader, flags: u8| -> Result<Option<Condition>, FrameError> {
        Ok(if flags & FLAG_IF_ABSENT != 0 {
            Some(Condition::Absent)
        } else if flags & FLAG_IF_VERSION != 0 {
            Some(Condition::Version(r.u64("condition's version")?))
        } else {
            None
        })
    };
    let request = match op {
        OP_PUT => {
            check_flags(flags, FLAG_TTL | FLAG_IF_ABSENT | FLAG_IF_VERSION, "a put")?;
            let ttl_ms = if flags & FLAG_TTL != 0 {
                Some(r.u64("ttl")?)
            } else {
                None
            };
            let condition = condition(&mut r, flags)?;
            CacheRequest::Put {
                tenant,
                namespace,
                cache,
                key,
                ttl_ms,
                condition,
            }
        }
        OP_GET | OP_COUNTER_GET => {
            check_flags(flags, 0, "a read")?;
            if op == OP_GET {
                CacheRequest::Get {
                    tenant,
                    namespace,
                    cache,
                    key,
                }
            } else {
                CacheRequest::CounterGet {
                    tenant,
                    namespace,
                    cache,
                    key,
                }
            }
        }
        OP_DELETE => {
            check_flags(flags, FLAG_IF_ABSENT | FLAG_IF_VERSION, "a delete")?;
            let condition = condition(&mut r, flags)?;
            CacheRequest::Delete {
                tenant,
                namespace,
                cache,
                key,
                condition,
            }
        }
        OP_COUNTER_ADD => {
            check_flags(flags, 0, "a counter add")?;
            CacheRequest::CounterAdd {
                tenant,
                namespace,
                cache,
                key,
                delta: r.u64("delta")? as i64,
            }
        }
        other => return Err(bad(format_args!("unknown operation {other}"))),
    };
    r.end()?;
    Ok(request)
}

/// Reads a binary answer header back into the answer it stands for.
pub fn decode_response(header: &[u8]) -> Result<CacheResponse, FrameError> {
    let mut r = start(header, "answer header")?;
    let response = match r.u8("answer")? {
        ANSWER_WRITTEN => CacheResponse::Written {
            version: r.u64("version")?,
        },
        ANSWER_VALUE => {
            let flags = r.u8("flags")?;
            if flags & !(FLAG_FOUND | FLAG_TTL) != 0 {
                return Err(bad(format_args!("unknown flags {flags:#04x} on a value")));
            }
            let version = r.u64("version")?;
            let ttl_ms = if flags & FLAG_TTL != 0 {
                Some(r.u64("ttl")?)
            } else {
                None
            };
            CacheResponse::Value {
                found: flags & FLAG_FOUND != 0,
                version,
                ttl_ms,
            }
        }
        ANSWER_DELETED => CacheResponse::Deleted {
            existed: match r.u8("existed")? {
                0 => false,
                1 => true,
                other => return Err(bad(format_args!("existed is {other}, not 0 or 1"))),
            },
        },
        ANSWER_COUNTER => CacheResponse::Counter {
            value: r.u64("value")? as i64,
            version: r.u64("version")?,
        },
        other => return Err(bad(format_args!("unknown answer {other}"))),
    };
    r.end()?;
    Ok(response)
}

/// A request frame's header, in whichever encoding it is: binary ([`TAG`] first, or the
/// groups' tag, `binary_groups.rs`) or JSON.
pub fn read_request(header: &[u8]) -> Result<Request, FrameError> {
    if crate::binary_groups::is_binary(header) {
        crate::binary_groups::decode_request(header).map(Request::Group)
    } else if is_binary(header) {
        decode_request(header).map(Request::Cache)
    } else {
        serde_json::from_slice(header).map_err(|e| FrameError::BadHeader(e.to_string()))
    }
}

/// A response frame's header, in whichever encoding it is: binary ([`TAG`] first, or the
/// groups' tag) or JSON.
pub fn read_response(header: &[u8]) -> Result<Response, FrameError> {
    if crate::binary_groups::is_binary(header) {
        crate::binary_groups::decode_response(header).map(Response::Group)
    } else if is_binary(header) {
        decode_response(header).map(Response::Cache)
    } else {
        serde_json::from_slice(header).map_err(|e| FrameError::BadHeader(e.to_string()))
    }
}

/// The header of a request frame: binary when `binary` (the broker agreed to
/// `BINARY_CACHE_HEADERS`) and the request has a binary form, else JSON.
pub fn request_header(request: &Request, binary: bool) -> Vec<u8> {
    match request {
        Request::Cache(op) if binary => encode_request(op).unwrap_or_else(|| json(request)),
        _ => json(request),
    }
}

/// The header of a response frame: binary when `binary` (the request was) and the answer
/// has a binary form, else JSON.
pub fn response_header(response: &Response, binary: bool) -> Vec<u8> {
    match response {
        Response::Cache(answer) if binary => {
            encode_response(answer).unwrap_or_else(|| json(response))
        }
        _ => json(response),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scope(key: &str) -> (String, String, String, String) {
        ("acme".into(), "prod".into(), "sessions".into(), key.into())
    }

    fn every_request() -> Vec<CacheRequest> {
        let (tenant, namespace, cache, key) = scope("user:42");
        let mut all = Vec::new();
        for (ttl_ms, condition) in [
            (None, None),
            (Some(60_000), None),
            (None, Some(Condition::Absent)),
            (Some(1), Some(Condition::Version(u64::MAX))),
        ] {
            all.push(CacheRequest::Put {
                tenant: tenant.clone(),
                namespace: namespace.clone(),
                cache: cache.clone(),
                key: key.clone(),
                ttl_ms,
                condition,
            });
        }
        for condition in [None, Some(Condition::Absent), Some(Condition::Version(7))] {
            all.push(CacheRequest::Delete {
                tenant: tenant.clone(),
                namespace: namespace.clone(),
                cache: cache.clone(),
                key: key.clone(),
                condition,
            });
        }
        all.push(CacheRequest::Get {
            tenant: tenant.clone(),
            namespace: namespace.clone(),
            cache: cache.clone(),
            key: "ключ".into(),
        });
        all.push(CacheRequest::CounterAdd {
            tenant: tenant.clone(),
            namespace: namespace.clone(),
            cache: cache.clone(),
            key: key.clone(),
            delta: -5,
        });
        all.push(CacheRequest::CounterGet {
            tenant,
            namespace,
            cache,
            key: String::new(),
        });
        all
    }

    #[test]
    fn every_key_operation_and_answer_round_trips() {
        for request in every_request() {
            let header = encode_request(&request).expect("a key operation has a binary header");
            assert!(is_binary(&header));
            assert_eq!(decode_request(&header).expect("decodes"), request);
        }
        for response in [
            CacheResponse::Written { version: 3 },
            CacheResponse::Value {
                found: true,
                version: 9,
                ttl_ms: Some(500),
            },
            CacheResponse::Value {
                found: false,
                version: 0,
                ttl_ms: None,
            },
            CacheResponse::Deleted { existed: true },
            CacheResponse::Deleted { existed: false },
            CacheResponse::Counter {
                value: i64::MIN,
                version: 1,
            },
        ] {
            let header = encode_response(&response).expect("has a binary header");
            assert_eq!(decode_response(&header).expect("decodes"), response);
        }
        // Management and watches, and their answers, stay JSON.
        let list = CacheRequest::List {
            tenant: "t".into(),
            namespace: "n".into(),
        };
        assert_eq!(encode_request(&list), None);
        assert_eq!(encode_response(&CacheResponse::Watching {}), None);
        // A JSON header is never taken for a binary one.
        assert!(!is_binary(br#"{"type":"cache"}"#));
    }

    #[test]
    fn malformed_headers_are_typed_errors() {
        let put = encode_request(&every_request()[1]).expect("encodes");
        let bad_header = |h: &[u8]| match decode_request(h) {
            Err(FrameError::BadHeader(why)) => why,
            other => panic!("{h:?}: expected a bad header, got {other:?}"),
        };
        // Every truncation, and one byte too many.
        for n in 0..put.len() {
            assert!(bad_header(&put[..n]).contains("cut short"), "cut at {n}");
        }
        let mut long = put.clone();
        long.push(0);
        assert!(bad_header(&long).contains("after the last field"));
        let mut op = put.clone();
        op[1] = 99;
        assert!(bad_header(&op).contains("unknown operation 99"));
        let mut flags = put.clone();
        flags[2] |= 0x80;
        assert!(bad_header(&flags).contains("unknown flags"));
        let mut both = put.clone();
        both[2] |= FLAG_IF_ABSENT | FLAG_IF_VERSION;
        assert!(bad_header(&both).contains("both"));
        // The tenant's first byte made invalid UTF-8.
        let mut utf8 = put.clone();
        utf8[5] = 0xFF;
        assert!(bad_header(&utf8).contains("tenant is not UTF-8"));
        let mut json = put.clone();
        json[0] = b'{';
        assert!(bad_header(&json).contains("binary tag"));
        let huge = CacheRequest::Get {
            tenant: "t".into(),
            namespace: "n".into(),
            cache: "c".into(),
            key: "k".repeat(MAX_KEY_BYTES + 1),
        };
        let header = encode_request(&huge).expect("fits 16 bits");
        assert!(bad_header(&header).contains("over the limit"));

        let answer = encode_response(&CacheResponse::Deleted { existed: true }).expect("encodes");
        let mut two = answer.clone();
        two[2] = 2;
        assert!(matches!(
            decode_response(&two),
            Err(FrameError::BadHeader(why)) if why.contains("not 0 or 1")
        ));
        assert!(matches!(
            decode_response(&[TAG, 77]),
            Err(FrameError::BadHeader(why)) if why.contains("unknown answer 77")
        ));
        assert!(matches!(
            decode_response(&answer[..2]),
            Err(FrameError::BadHeader(why)) if why.contains("cut short")
        ));
    }
}
