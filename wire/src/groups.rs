//! Consumer-group messages of the QUIC protocol (docs/groups.md, docs/protocol.md): a
//! `Request::Group` carries one [`GroupRequest`], answered by a `Response::Group` carrying
//! one [`GroupResponse`] (or `Response::Error`).
//!
//! A poll is made to one shard's leader; its answer's body is record batches holding the
//! claimed records at their offsets (stored batches as the log holds them, or one re-encoded
//! with only the claimed run when a poll takes part of a batch; a batch may hold records not
//! claimed), and [`GroupResponse::Claimed`]'s `records` say which offsets are claimed, with
//! each one's attempt and claim deadline. An answer (ack, nack, extend) names each
//! record by shard, offset and the attempt it was handed out with, and the consumer that
//! claimed it, so a late answer to an attempt that lapsed is refused rather than taken for
//! the current one.

use serde::{Deserialize, Serialize};

/// Where a new group starts on each shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum GroupStart {
    #[default]
    Earliest,
    /// The records published from the group's creation on.
    Latest,
    /// This offset on every shard (clamped to what the shard holds).
    Offset(u64),
    /// The first record stamped at or after this time (ms since the Unix epoch).
    Timestamp(i64),
}

/// A group's settings as the protocol carries them: unset means the default.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupConfig {
    /// How long a claimed record is held for its consumer (default 30 s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub visibility_timeout_ms: Option<u64>,
    /// Deliveries before a record is dead-lettered (default 5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u32>,
    /// `tenant/namespace/stream` to dead-letter to; none: retire and count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead_letter: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<GroupStart>,
}

/// A group as the broker describes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupInfo {
    pub tenant: String,
    pub namespace: String,
    pub stream: String,
    pub name: String,
    pub visibility_timeout_ms: u64,
    pub max_attempts: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead_letter: Option<String>,
    pub start: GroupStart,
    pub created_ms: i64,
    /// The shards this broker leads (all of them on a single node).
    #[serde(default)]
    pub shards: Vec<GroupShardInfo>,
}

/// A group's progress on one shard.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupShardInfo {
    pub shard: u32,
    /// Every record below this offset is acknowledged or dead-lettered.
    pub acked_up_to: u64,
    /// The next offset never handed out yet.
    pub next_offset: u64,
    /// Claimed and within their deadline.
    pub in_flight: u64,
    /// Nacked or lapsed, waiting to be handed out again.
    pub waiting: u64,
    /// Committed records never handed out yet.
    pub backlog: u64,
    pub acked: u64,
    pub dead_lettered: u64,
    /// Consumers that polled or answered in the last minute.
    #[serde(default)]
    pub consumers: Vec<String>,
}

/// One record named by an answer: where it is and which delivery of it is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimRef {
    pub offset: u64,
    pub attempt: u32,
}

/// What a poll handed out, per record (the records themselves are in the body).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimedMeta {
    pub offset: u64,
    /// 1 for the first delivery.
    pub attempt: u32,
    /// The claim lapses at this time (ms since the Unix epoch).
    pub deadline_ms: i64,
}

/// The group requests. Every one names the group by tenant, namespace, stream and name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum GroupRequest {
    Create {
        tenant: String,
        namespace: String,
        stream: String,
        group: String,
        config: GroupConfig,
    },
    /// Changes the settings `config` sets (`start` cannot change; `dead_letter: ""`
    /// removes the dead-letter stream). Applies to claims and deliveries from then on.
    Alter {
        tenant: String,
        namespace: String,
        stream: String,
        group: String,
        config: GroupConfig,
    },
    Describe {
        tenant: String,
        namespace: String,
        stream: String,
        group: String,
    },
    List {
        tenant: String,
        namespace: String,
        stream: String,
    },
    Delete {
        tenant: String,
        namespace: String,
        stream: String,
        group: String,
    },
    /// Claims up to `max_records` (about `max_bytes`) of one shard; with `wait_ms`, parks
    /// until a record is there or the wait ends.
    Poll {
        tenant: String,
        namespace: String,
        stream: String,
        group: String,
        shard: u32,
        consumer: String,
        max_records: u32,
        #[serde(default)]
        max_bytes: u64,
        #[serde(default)]
        wait_ms: u64,
    },
    Ack {
        tenant: String,
        namespace: String,
        stream: String,
        group: String,
        shard: u32,
        consumer: String,
        records: Vec<ClaimRef>,
    },
    /// Releases the records: handed out again at once, or after `delay_ms`.
    Nack {
        tenant: String,
        namespace: String,
        stream: String,
        group: String,
        shard: u32,
        consumer: String,
        records: Vec<ClaimRef>,
        #[serde(default)]
        delay_ms: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    /// Moves the records' deadline to now + `visibility_ms` (default: the group's timeout).
    Extend {
        tenant: String,
        namespace: String,
        stream: String,
        group: String,
        shard: u32,
        consumer: String,
        records: Vec<ClaimRef>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        visibility_ms: Option<u64>,
    },
    /// Single-writer fencing: moves the group's position on the shard from
    /// `expected_offset` to `offset` (everything below it retired), only if the position is
    /// still `expected_offset`; else `expected_offset_mismatch` with the actual position.
    Commit {
        tenant: String,
        namespace: String,
        stream: String,
        group: String,
        shard: u32,
        consumer: String,
        expected_offset: u64,
        offset: u64,
    },
}

impl GroupRequest {
    /// The stream the request is about: `(tenant, namespace, stream)`.
    pub fn stream(&self) -> (&str, &str, &str) {
        match self {
            GroupRequest::Create {
                tenant,
                namespace,
                stream,
                ..
            }
            | GroupRequest::Alter {
                tenant,
                namespace,
                stream,
                ..
            }
            | GroupRequest::Describe {
                tenant,
                namespace,
                stream,
                ..
            }
            | GroupRequest::List {
                tenant,
                namespace,
                stream,
            }
            | GroupRequest::Delete {
                tenant,
                namespace,
                stream,
                ..
            }
            | GroupRequest::Poll {
                tenant,
                namespace,
                stream,
                ..
            }
            | GroupRequest::Ack {
                tenant,
                namespace,
                stream,
                ..
            }
            | GroupRequest::Nack {
                tenant,
                namespace,
                stream,
                ..
            }
            | GroupRequest::Extend {
                tenant,
                namespace,
                stream,
                ..
            }
            | GroupRequest::Commit {
                tenant,
                namespace,
                stream,
                ..
            } => (tenant, namespace, stream),
        }
    }
}

/// The answers to group requests.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum GroupResponse {
    Group {
        group: GroupInfo,
    },
    Groups {
        groups: Vec<GroupInfo>,
    },
    /// The body holds these records' batches (none: no body); keep only these offsets.
    Claimed {
        shard: u32,
        records: Vec<ClaimedMeta>,
    },
    /// A commit's new position on the shard.
    Committed {
        shard: u32,
        offset: u64,
    },
    /// Every answered record, with its new deadline for an extend.
    Answered {
        shard: u32,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        deadlines_ms: Vec<i64>,
    },
}

/// Stable reasons of the group error codes (codes in [`crate::protocol::codes`]).
pub mod reasons {
    pub const UNKNOWN_GROUP: &str = "unknown_group";
    pub const CLAIM_EXPIRED: &str = "claim_expired";
    pub const NOT_CLAIMED: &str = "not_claimed_by_you";
    pub const EXPECTED_OFFSET_MISMATCH: &str = "expected_offset_mismatch";
}

/// The header keys of a dead-lettered record (its own headers follow them).
pub mod dead_letter_headers {
    pub const STREAM: &str = "felix-dlq-stream";
    pub const SHARD: &str = "felix-dlq-shard";
    pub const OFFSET: &str = "felix-dlq-offset";
    pub const GROUP: &str = "felix-dlq-group";
    pub const ATTEMPTS: &str = "felix-dlq-attempts";
    pub const REASON: &str = "felix-dlq-reason";
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Request, Response};

    #[test]
    fn group_messages_nest_in_requests_and_responses() {
        let r = Request::Group(GroupRequest::Ack {
            tenant: "t".into(),
            namespace: "n".into(),
            stream: "s".into(),
            group: "g".into(),
            shard: 3,
            consumer: "c".into(),
            records: vec![ClaimRef {
                offset: 7,
                attempt: 2,
            }],
        });
        let json = serde_json::to_string(&r).unwrap();
        assert!(json.contains(r#""type":"group""#), "{json}");
        assert!(json.contains(r#""op":"ack""#), "{json}");
        assert_eq!(serde_json::from_str::<Request>(&json).unwrap(), r);
        let a = Response::Group(GroupResponse::Claimed {
            shard: 1,
            records: vec![ClaimedMeta {
                offset: 1,
                attempt: 1,
                deadline_ms: 5,
            }],
        });
        let json = serde_json::to_string(&a).unwrap();
        assert_eq!(serde_json::from_str::<Response>(&json).unwrap(), a);
    }
}
