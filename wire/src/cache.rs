//! Cache messages of the QUIC protocol (docs/cache.md, docs/protocol.md): a
//! `Request::Cache` carries one [`CacheRequest`], answered by a `Response::Cache` carrying
//! one [`CacheResponse`] (or `Response::Error`).
//!
//! A value travels as the frame's body, never in the JSON header: a put's request body is
//! the value, and a get's answer body is the value found. A watch is its own stream, like
//! a subscription: `Response::Cache(CacheResponse::Watching)` and then one
//! `Event::CacheChange` per change (its body the new value), until `Event::End`.
//!
//! Every key is scoped to (tenant, namespace, cache): the same key in another cache,
//! namespace or tenant is another entry.

use serde::{Deserialize, Serialize};

/// The largest value a cache holds (the spec: large values belong in object storage).
pub const MAX_VALUE_BYTES: usize = 1024 * 1024;
/// The longest key, in bytes of UTF-8.
pub const MAX_KEY_BYTES: usize = 1024;

/// A cache's settings as the protocol carries them: unset means the default.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheConfig {
    /// Log-backed (`true`: survives a restart, replicated) or in-memory (the default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub durable: Option<bool>,
    /// `leader` (the default) or `quorum`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consistency: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shards: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<u32>,
}

/// A cache as the broker describes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheInfo {
    pub tenant: String,
    pub namespace: String,
    pub name: String,
    pub durable: bool,
    pub consistency: String,
    pub shards: u32,
    pub replicas: u32,
}

/// When a conditional write (`cache_put_if`, `cache_delete_if`) applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Condition {
    /// Only while the key holds no (unexpired) value.
    Absent,
    /// Only while the key's value is at this version (the one the caller read).
    Version(u64),
}

/// A cache request: management (create, describe, list, delete) and the operations on keys.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum CacheRequest {
    Create {
        tenant: String,
        namespace: String,
        name: String,
        #[serde(default)]
        config: CacheConfig,
    },
    Describe {
        tenant: String,
        namespace: String,
        name: String,
    },
    List {
        tenant: String,
        namespace: String,
    },
    /// Deletes the cache and every entry in it.
    Drop {
        tenant: String,
        namespace: String,
        name: String,
    },
    /// The body is the value. Answered `Written`; with a `condition` that does not hold,
    /// refused with `version_conflict` and nothing written.
    Put {
        tenant: String,
        namespace: String,
        cache: String,
        key: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        ttl_ms: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        condition: Option<Condition>,
    },
    /// Answered `Value` (its body the value, when found).
    Get {
        tenant: String,
        namespace: String,
        cache: String,
        key: String,
    },
    /// Answered `Deleted`; with a `condition` that does not hold, `version_conflict`.
    Delete {
        tenant: String,
        namespace: String,
        cache: String,
        key: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        condition: Option<Condition>,
    },
    /// Adds `delta` to the key's counter (absent counts as 0) at the owner, atomically.
    /// Answered `Counter` with the new value.
    CounterAdd {
        tenant: String,
        namespace: String,
        cache: String,
        key: String,
        delta: i64,
    },
    /// Answered `Counter` (0 when absent).
    CounterGet {
        tenant: String,
        namespace: String,
        cache: String,
        key: String,
    },
    /// A stream of the changes to `key`, or to every key starting with `prefix` (exactly
    /// one of the two). A prefix watch with `shard` watches that shard of the cache only
    /// (at its owner): how a client follows a prefix across shards owned by several
    /// brokers.
    Watch {
        tenant: String,
        namespace: String,
        cache: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        key: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        prefix: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        shard: Option<u32>,
        /// Resume after a change already heard (a key watch, or a prefix watch naming its
        /// shard, of a log-backed cache).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        resume: Option<WatchResume>,
    },
}

impl CacheRequest {
    /// The tenant, namespace and cache the request is about.
    pub fn cache(&self) -> (&str, &str, &str) {
        match self {
            CacheRequest::Create {
                tenant,
                namespace,
                name,
                ..
            }
            | CacheRequest::Describe {
                tenant,
                namespace,
                name,
            }
            | CacheRequest::Drop {
                tenant,
                namespace,
                name,
            } => (tenant, namespace, name),
            CacheRequest::List { tenant, namespace } => (tenant, namespace, ""),
            CacheRequest::Put {
                tenant,
                namespace,
                cache,
                ..
            }
            | CacheRequest::Get {
                tenant,
                namespace,
                cache,
                ..
            }
            | CacheRequest::Delete {
                tenant,
                namespace,
                cache,
                ..
            }
            | CacheRequest::CounterAdd {
                tenant,
                namespace,
                cache,
                ..
            }
            | CacheRequest::CounterGet {
                tenant,
                namespace,
                cache,
                ..
            }
            | CacheRequest::Watch {
                tenant,
                namespace,
                cache,
                ..
            } => (tenant, namespace, cache),
        }
    }

    /// The key an operation on one key is about (`None` for management and watches).
    pub fn key(&self) -> Option<&str> {
        match self {
            CacheRequest::Put { key, .. }
            | CacheRequest::Get { key, .. }
            | CacheRequest::Delete { key, .. }
            | CacheRequest::CounterAdd { key, .. }
            | CacheRequest::CounterGet { key, .. } => Some(key),
            _ => None,
        }
    }

    /// The operation's name, as metrics and logs spell it.
    pub fn kind(&self) -> &'static str {
        match self {
            CacheRequest::Create { .. } => "create",
            CacheRequest::Describe { .. } => "describe",
            CacheRequest::List { .. } => "list",
            CacheRequest::Drop { .. } => "drop",
            CacheRequest::Put {
                condition: None, ..
            } => "put",
            CacheRequest::Put { .. } => "put_if",
            CacheRequest::Get { .. } => "get",
            CacheRequest::Delete {
                condition: None, ..
            } => "delete",
            CacheRequest::Delete { .. } => "delete_if",
            CacheRequest::CounterAdd { .. } => "counter_add",
            CacheRequest::CounterGet { .. } => "counter_get",
            CacheRequest::Watch { .. } => "watch",
        }
    }
}

/// The answer to a [`CacheRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
// Not `type`: a `Response::Cache` is tagged `type` already.
#[serde(tag = "answer", rename_all = "snake_case")]
pub enum CacheResponse {
    Cache {
        cache: CacheInfo,
    },
    Caches {
        caches: Vec<CacheInfo>,
    },
    Done {},
    /// A put's version.
    Written {
        version: u64,
    },
    /// A get: `found` false when absent or expired; else the body is the value, at
    /// `version`, with `ttl_ms` left (none: no expiry).
    Value {
        found: bool,
        #[serde(default)]
        version: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        ttl_ms: Option<u64>,
    },
    /// A delete: whether there was a value to delete.
    Deleted {
        existed: bool,
    },
    /// A counter's value (after the add, for `counter_add`) and its version.
    Counter {
        value: i64,
        version: u64,
    },
    /// The watch starts: one `Event::CacheChange` per change from here on.
    Watching {},
}

/// What a change did to a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChangeKind {
    /// A put or a counter add: the event's body is the new value.
    Put,
    /// A delete asked for by a client.
    Delete,
    /// The entry's TTL passed and the owner deleted it.
    Expire,
}

/// One change a watch delivers (the body is the new value for [`ChangeKind::Put`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheChange {
    pub key: String,
    pub kind: ChangeKind,
    pub version: u64,
    /// The change's offset in its shard's log (log-backed caches): where a watch resumes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset: Option<u64>,
}

/// Where a watch of one shard resumes (log-backed caches): after the change it heard last,
/// at log offset `next_offset - 1` with version `last_version`. The owner replays what its
/// log holds from there, so nothing made while the watch was being reopened is missed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchResume {
    pub next_offset: u64,
    pub last_version: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip_as_tagged_json() {
        let put = CacheRequest::Put {
            tenant: "t".into(),
            namespace: "n".into(),
            cache: "c".into(),
            key: "k".into(),
            ttl_ms: Some(60_000),
            condition: Some(Condition::Version(7)),
        };
        let json = serde_json::to_string(&put).expect("encodes");
        assert!(json.contains(r#""op":"put""#), "{json}");
        assert!(json.contains(r#""condition":{"version":7}"#), "{json}");
        let back: CacheRequest = serde_json::from_str(&json).expect("decodes");
        assert_eq!(back, put);
        assert_eq!((back.cache(), back.key()), (("t", "n", "c"), Some("k")));
        assert_eq!(back.kind(), "put_if");
        // Inside a response, whose own tag is `type`, the answer still reads back.
        let r = crate::protocol::Response::Cache(CacheResponse::Written { version: 3 });
        let json = serde_json::to_string(&r).expect("encodes");
        assert_eq!(
            serde_json::from_str::<crate::protocol::Response>(&json).expect("decodes"),
            r
        );
        let absent: Condition = serde_json::from_str(r#""absent""#).expect("absent");
        assert_eq!(absent, Condition::Absent);
    }
}
