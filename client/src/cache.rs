//! The cache calls (docs/cache.md): shared by a [`crate::Client`] (sent to any live broker,
//! which forwards an operation to the key's owner; reads re-sent when safe) and a
//! [`crate::Connection`] (its one broker, never re-sent), and the watch stream.
//!
//! Invariant: a method sends the same request and accepts the same answer whichever of the
//! two sends it; a value travels as the frame's body, never inside the JSON header.
//!
//! ```no_run
//! use bytes::Bytes;
//! use felix_client::{CacheConfig, Client, ClientConfig, Condition};
//!
//! # async fn demo(session_id: &str, session_data: Vec<u8>) -> Result<(), felix_client::ClientError> {
//! let client = Client::connect(["127.0.0.1:5000"], ClientConfig::default()).await?;
//! let config = CacheConfig { durable: Some(true), ..Default::default() };
//! client.create_cache("acme", "prod", "session", config).await?;
//!
//! // Store with 60-second TTL
//! client
//!     .cache_put(
//!         "acme",
//!         "prod",
//!         "session",
//!         session_id,
//!         Bytes::from(session_data),
//!         Some(60_000),
//!     )
//!     .await?;
//!
//! // Rate limiting and other counters, added atomically at the key's owner
//! let hits = client.counter_add("acme", "prod", "session", "hits:alice", 1).await?;
//! assert!(hits >= 1);
//!
//! // Write only where nobody has: exactly one of several callers wins
//! let won = client
//!     .cache_put_if("acme", "prod", "session", "lock", Bytes::from("me"), None, Condition::Absent)
//!     .await;
//! # let _ = won;
//! # Ok(()) }
//! ```
//!
//! The spec's scoping example compiles as written:
//!
//! ```no_run
//! # use bytes::Bytes;
//! # async fn demo(client: felix_client::Client) -> Result<(), felix_client::ClientError> {
//! # let data = Bytes::from("x");
//! // These are independent cache entries:
//! client.cache_put("tenant1", "prod", "sessions", "user123", data.clone(), None).await?;
//! client.cache_put("tenant1", "staging", "sessions", "user123", data.clone(), None).await?;
//! client.cache_put("tenant2", "prod", "sessions", "user123", data, None).await?;
//! # let (config_key, config_value) = ("k", "v");
//! // Store without expiration
//! client
//!     .cache_put("acme", "prod", "config", config_key, Bytes::from(config_value), None)
//!     .await?;
//! # Ok(()) }
//! ```

use bytes::Bytes;
use felix_wire::cache::{CacheChange, CacheRequest, CacheResponse, ChangeKind, WatchResume};
use felix_wire::protocol::{Event as WireEvent, FrameKind, Request, Response, codes};

use crate::error::ClientError;
use crate::{Connection, request};

/// A value a get found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheValue {
    pub value: Bytes,
    /// Pass it to [`Condition::Version`] to write only if nobody wrote since.
    pub version: u64,
    /// Left of its TTL; `None` when it has no expiry.
    pub ttl_ms: Option<u64>,
}

/// One change a watch delivers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheEvent {
    pub key: String,
    pub kind: ChangeKind,
    pub version: u64,
    /// The new value of a put or counter add; empty for a delete or expiry.
    pub value: Bytes,
    /// The change's offset in its shard's log (log-backed caches; `None` in memory): a
    /// watch reopened after it resumes there ([`Connection::resume_watch`]).
    pub offset: Option<u64>,
}

impl CacheEvent {
    /// Where a watch resumes to hear what came after this change (log-backed caches).
    pub fn resume_after(&self) -> Option<WatchResume> {
        self.offset.map(|o| WatchResume {
            next_offset: o + 1,
            last_version: self.version,
        })
    }
}

/// What a watch follows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchTarget {
    Key(String),
    Prefix(String),
}

pub(crate) fn unexpected(what: &str, r: &CacheResponse) -> ClientError {
    ClientError::Protocol(format!("unexpected answer to cache {what}: {r:?}"))
}

/// Builds the request of an operation on one key.
pub(crate) fn key_request(
    (tenant, namespace, cache): (&str, &str, &str),
    key: &str,
    extra: KeyOp,
) -> CacheRequest {
    let (tenant, namespace, cache, key) = (
        tenant.to_owned(),
        namespace.to_owned(),
        cache.to_owned(),
        key.to_owned(),
    );
    match extra {
        KeyOp::Put { ttl_ms, condition } => CacheRequest::Put {
            tenant,
            namespace,
            cache,
            key,
            ttl_ms,
            condition,
        },
        KeyOp::Get => CacheRequest::Get {
            tenant,
            namespace,
            cache,
            key,
        },
        KeyOp::Delete { condition } => CacheRequest::Delete {
            tenant,
            namespace,
            cache,
            key,
            condition,
        },
        KeyOp::CounterAdd { delta } => CacheRequest::CounterAdd {
            tenant,
            namespace,
            cache,
            key,
            delta,
        },
        KeyOp::CounterGet => CacheRequest::CounterGet {
            tenant,
            namespace,
            cache,
            key,
        },
    }
}

/// The operation-specific part of a key request.
pub(crate) enum KeyOp {
    Put {
        ttl_ms: Option<u64>,
        condition: Option<felix_wire::cache::Condition>,
    },
    Get,
    Delete {
        condition: Option<felix_wire::cache::Condition>,
    },
    CounterAdd {
        delta: i64,
    },
    CounterGet,
}

/// The cache methods of a type that has
/// `async fn cache_call(&self, CacheRequest, Bytes, idempotent: bool) -> Result<(CacheResponse, Bytes), ClientError>`.
macro_rules! cache_requests {
    () => {
        /// Creates a cache (in memory unless `durable`; Leader unless `quorum`).
        pub async fn create_cache(
            &self,
            tenant: &str,
            namespace: &str,
            name: &str,
            config: $crate::CacheConfig,
        ) -> Result<$crate::CacheInfo, $crate::ClientError> {
            let request = felix_wire::cache::CacheRequest::Create {
                tenant: tenant.to_owned(),
                namespace: namespace.to_owned(),
                name: name.to_owned(),
                config,
            };
            match self.cache_call(request, bytes::Bytes::new(), false).await? {
                (felix_wire::cache::CacheResponse::Cache { cache }, _) => Ok(cache),
                (other, _) => Err($crate::cache::unexpected("create", &other)),
            }
        }

        /// A cache's settings.
        pub async fn describe_cache(
            &self,
            tenant: &str,
            namespace: &str,
            name: &str,
        ) -> Result<$crate::CacheInfo, $crate::ClientError> {
            let request = felix_wire::cache::CacheRequest::Describe {
                tenant: tenant.to_owned(),
                namespace: namespace.to_owned(),
                name: name.to_owned(),
            };
            match self.cache_call(request, bytes::Bytes::new(), true).await? {
                (felix_wire::cache::CacheResponse::Cache { cache }, _) => Ok(cache),
                (other, _) => Err($crate::cache::unexpected("describe", &other)),
            }
        }

        /// The caches of a namespace, by name.
        pub async fn list_caches(
            &self,
            tenant: &str,
            namespace: &str,
        ) -> Result<Vec<$crate::CacheInfo>, $crate::ClientError> {
            let request = felix_wire::cache::CacheRequest::List {
                tenant: tenant.to_owned(),
                namespace: namespace.to_owned(),
            };
            match self.cache_call(request, bytes::Bytes::new(), true).await? {
                (felix_wire::cache::CacheResponse::Caches { caches }, _) => Ok(caches),
                (other, _) => Err($crate::cache::unexpected("list", &other)),
            }
        }

        /// Drops a cache and every entry in it.
        pub async fn delete_cache(
            &self,
            tenant: &str,
            namespace: &str,
            name: &str,
        ) -> Result<(), $crate::ClientError> {
            let request = felix_wire::cache::CacheRequest::Drop {
                tenant: tenant.to_owned(),
                namespace: namespace.to_owned(),
                name: name.to_owned(),
            };
            match self.cache_call(request, bytes::Bytes::new(), false).await? {
                (felix_wire::cache::CacheResponse::Done {}, _) => Ok(()),
                (other, _) => Err($crate::cache::unexpected("drop", &other)),
            }
        }

        /// Stores `value` under `key`, expiring `ttl_ms` after the call returns (none: never).
        /// The value's new version.
        pub async fn cache_put(
            &self,
            tenant: &str,
            namespace: &str,
            cache: &str,
            key: impl AsRef<str>,
            value: impl Into<bytes::Bytes>,
            ttl_ms: Option<u64>,
        ) -> Result<u64, $crate::ClientError> {
            self.put_inner(
                (tenant, namespace, cache),
                key.as_ref(),
                value.into(),
                ttl_ms,
                None,
            )
            .await
        }

        /// Stores `value` only when `condition` holds (the key is absent, or at the version
        /// the caller read); otherwise refused with `version_conflict` and nothing written.
        #[allow(clippy::too_many_arguments)]
        pub async fn cache_put_if(
            &self,
            tenant: &str,
            namespace: &str,
            cache: &str,
            key: impl AsRef<str>,
            value: impl Into<bytes::Bytes>,
            ttl_ms: Option<u64>,
            condition: $crate::Condition,
        ) -> Result<u64, $crate::ClientError> {
            self.put_inner(
                (tenant, namespace, cache),
                key.as_ref(),
                value.into(),
                ttl_ms,
                Some(condition),
            )
            .await
        }

        async fn put_inner(
            &self,
            scope: (&str, &str, &str),
            key: &str,
            value: bytes::Bytes,
            ttl_ms: Option<u64>,
            condition: Option<$crate::Condition>,
        ) -> Result<u64, $crate::ClientError> {
            let request = $crate::cache::key_request(
                scope,
                key,
                $crate::cache::KeyOp::Put { ttl_ms, condition },
            );
            match self.cache_call(request, value, false).await? {
                (felix_wire::cache::CacheResponse::Written { version }, _) => Ok(version),
                (other, _) => Err($crate::cache::unexpected("put", &other)),
            }
        }

        /// The key's value, or `None` when it is absent or its TTL has passed.
        pub async fn cache_get(
            &self,
            tenant: &str,
            namespace: &str,
            cache: &str,
            key: impl AsRef<str>,
        ) -> Result<Option<bytes::Bytes>, $crate::ClientError> {
            Ok(self
                .cache_get_versioned(tenant, namespace, cache, key)
                .await?
                .map(|v| v.value))
        }

        /// [`cache_get`](Self::cache_get) with the value's version and TTL left.
        pub async fn cache_get_versioned(
            &self,
            tenant: &str,
            namespace: &str,
            cache: &str,
            key: impl AsRef<str>,
        ) -> Result<Option<$crate::CacheValue>, $crate::ClientError> {
            let request = $crate::cache::key_request(
                (tenant, namespace, cache),
                key.as_ref(),
                $crate::cache::KeyOp::Get,
            );
            match self.cache_call(request, bytes::Bytes::new(), true).await? {
                (
                    felix_wire::cache::CacheResponse::Value {
                        found,
                        version,
                        ttl_ms,
                    },
                    value,
                ) => Ok(found.then_some($crate::CacheValue {
                    value,
                    version,
                    ttl_ms,
                })),
                (other, _) => Err($crate::cache::unexpected("get", &other)),
            }
        }

        /// Deletes the key; whether it held a value.
        pub async fn cache_delete(
            &self,
            tenant: &str,
            namespace: &str,
            cache: &str,
            key: impl AsRef<str>,
        ) -> Result<bool, $crate::ClientError> {
            self.delete_inner((tenant, namespace, cache), key.as_ref(), None)
                .await
        }

        /// Deletes the key only when `condition` holds; otherwise `version_conflict`.
        pub async fn cache_delete_if(
            &self,
            tenant: &str,
            namespace: &str,
            cache: &str,
            key: impl AsRef<str>,
            condition: $crate::Condition,
        ) -> Result<bool, $crate::ClientError> {
            self.delete_inner((tenant, namespace, cache), key.as_ref(), Some(condition))
                .await
        }

        async fn delete_inner(
            &self,
            scope: (&str, &str, &str),
            key: &str,
            condition: Option<$crate::Condition>,
        ) -> Result<bool, $crate::ClientError> {
            let request =
                $crate::cache::key_request(scope, key, $crate::cache::KeyOp::Delete { condition });
            match self.cache_call(request, bytes::Bytes::new(), false).await? {
                (felix_wire::cache::CacheResponse::Deleted { existed }, _) => Ok(existed),
                (other, _) => Err($crate::cache::unexpected("delete", &other)),
            }
        }

        /// Adds `delta` to the key's counter (absent counts as 0), atomically at the key's
        /// owner; the new value.
        pub async fn counter_add(
            &self,
            tenant: &str,
            namespace: &str,
            cache: &str,
            key: impl AsRef<str>,
            delta: i64,
        ) -> Result<i64, $crate::ClientError> {
            let request = $crate::cache::key_request(
                (tenant, namespace, cache),
                key.as_ref(),
                $crate::cache::KeyOp::CounterAdd { delta },
            );
            match self.cache_call(request, bytes::Bytes::new(), false).await? {
                (felix_wire::cache::CacheResponse::Counter { value, .. }, _) => Ok(value),
                (other, _) => Err($crate::cache::unexpected("counter_add", &other)),
            }
        }

        /// The key's counter (0 when absent).
        pub async fn counter_get(
            &self,
            tenant: &str,
            namespace: &str,
            cache: &str,
            key: impl AsRef<str>,
        ) -> Result<i64, $crate::ClientError> {
            let request = $crate::cache::key_request(
                (tenant, namespace, cache),
                key.as_ref(),
                $crate::cache::KeyOp::CounterGet,
            );
            match self.cache_call(request, bytes::Bytes::new(), true).await? {
                (felix_wire::cache::CacheResponse::Counter { value, .. }, _) => Ok(value),
                (other, _) => Err($crate::cache::unexpected("counter_get", &other)),
            }
        }
    };
}

pub(crate) fn watch_request(
    tenant: &str,
    namespace: &str,
    cache: &str,
    target: &WatchTarget,
    shard: Option<u32>,
    resume: Option<WatchResume>,
) -> CacheRequest {
    let (key, prefix) = match target {
        WatchTarget::Key(k) => (Some(k.clone()), None),
        WatchTarget::Prefix(p) => (None, Some(p.clone())),
    };
    CacheRequest::Watch {
        tenant: tenant.to_owned(),
        namespace: namespace.to_owned(),
        cache: cache.to_owned(),
        key,
        prefix,
        shard,
        resume,
    }
}

/// A watch on one broker: its changes, in the order the owner applied them, until it ends.
pub struct CacheWatch {
    recv: quinn::RecvStream,
    // Kept open: dropping it would reset the stream.
    _send: quinn::SendStream,
    max_frame: usize,
    done: bool,
}

impl std::fmt::Debug for CacheWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CacheWatch")
            .field("done", &self.done)
            .finish()
    }
}

impl CacheWatch {
    /// The next change; `Ok(None)` once the broker closed the watch cleanly, `Err` with the
    /// broker's reason when it ended it (`not_leader`: open it again at the owner;
    /// `watch_lagged`: changes were missed).
    pub async fn next_change(&mut self) -> Result<Option<CacheEvent>, ClientError> {
        if self.done {
            return Ok(None);
        }
        let frame = match request::read_frame(&mut self.recv, self.max_frame).await {
            Ok(Some(f)) => f,
            Ok(None) => {
                self.done = true;
                return Ok(None);
            }
            Err(e) => {
                self.done = true;
                return Err(e);
            }
        };
        if frame.kind != FrameKind::Event {
            self.done = true;
            return Err(ClientError::Protocol(format!(
                "expected an event frame on a watch, got {:?}",
                frame.kind
            )));
        }
        match frame.header::<WireEvent>() {
            Ok(WireEvent::CacheChange(CacheChange {
                key,
                kind,
                version,
                offset,
            })) => Ok(Some(CacheEvent {
                key,
                kind,
                version,
                value: frame.body,
                offset,
            })),
            Ok(WireEvent::End(body)) => {
                self.done = true;
                Err(ClientError::Broker(body))
            }
            Ok(other) => {
                self.done = true;
                Err(ClientError::Protocol(format!(
                    "unexpected event on a watch: {other:?}"
                )))
            }
            Err(e) => {
                self.done = true;
                Err(ClientError::Protocol(e.to_string()))
            }
        }
    }
}

impl Connection {
    async fn cache_call(
        &self,
        request: CacheRequest,
        body: Bytes,
        _idempotent: bool,
    ) -> Result<(CacheResponse, Bytes), ClientError> {
        let request = Request::Cache(request);
        match self
            .call_cache(&request, body, self.request_timeout())
            .await?
        {
            (Response::Cache(r), body) => Ok((r, body)),
            (other, _) => Err(crate::unexpected("Cache", &other)),
        }
    }

    cache_requests!();

    /// Watches a key or a prefix on this broker, which must own the shards concerned
    /// (else `not_leader` names the owner).
    pub async fn watch_cache(
        &self,
        tenant: &str,
        namespace: &str,
        cache: &str,
        target: WatchTarget,
    ) -> Result<CacheWatch, ClientError> {
        self.open_watch(watch_request(tenant, namespace, cache, &target, None, None))
            .await
    }

    /// Watches the keys starting with `prefix` in one shard of the cache, on this broker,
    /// which must own that shard (else `not_leader` names the owner): a prefix watch of a
    /// cache whose shards several brokers own is one of these per shard, as
    /// [`crate::Client::watch_cache`] opens them.
    pub async fn watch_cache_shard(
        &self,
        (tenant, namespace, cache): (&str, &str, &str),
        prefix: &str,
        shard: u32,
    ) -> Result<CacheWatch, ClientError> {
        let target = WatchTarget::Prefix(prefix.to_owned());
        self.open_watch(watch_request(
            tenant,
            namespace,
            cache,
            &target,
            Some(shard),
            None,
        ))
        .await
    }

    /// Opens a watch of one shard again after the change it heard last
    /// ([`CacheEvent::resume_after`]), on this broker, which must own the shard: the owner
    /// first replays what its log holds after that change, so nothing made while the watch
    /// was closed is missed (log-backed caches). Ends with `watch_lagged` when the log no
    /// longer holds that change and `watch_diverged` when it holds another: changes were
    /// missed. `shard` names a prefix watch's shard (none for a key).
    pub async fn resume_watch(
        &self,
        (tenant, namespace, cache): (&str, &str, &str),
        target: WatchTarget,
        shard: Option<u32>,
        resume: WatchResume,
    ) -> Result<CacheWatch, ClientError> {
        self.open_watch(watch_request(
            tenant,
            namespace,
            cache,
            &target,
            shard,
            Some(resume),
        ))
        .await
    }

    async fn open_watch(&self, request: CacheRequest) -> Result<CacheWatch, ClientError> {
        let request = Request::Cache(request);
        let max = self.max_frame();
        let frame = request::encode_request(&request, Bytes::new(), max)?;
        tokio::time::timeout(self.request_timeout(), async {
            let mut open = request::open(self.quinn(), &frame).await?;
            match request::read_response(&mut open.recv, max).await? {
                Response::Cache(CacheResponse::Watching {}) => Ok(CacheWatch {
                    recv: open.recv,
                    _send: open.send,
                    max_frame: max,
                    done: false,
                }),
                other => Err(crate::unexpected("Cache watch", &other)),
            }
        })
        .await
        .map_err(|_| ClientError::Timeout)?
    }
}

/// Whether a watch that ended so may be opened again (at the owner it names, or after a
/// wait): the owner changed, the shard is between owners, or the connection was lost.
pub(crate) fn reopenable(e: &ClientError) -> bool {
    match e {
        ClientError::Broker(b) => matches!(
            b.code,
            codes::NOT_LEADER | codes::SHARD_UNAVAILABLE | codes::SHARD_MOVED
        ),
        ClientError::Connect(_) | ClientError::Transport(_) | ClientError::Timeout => true,
        _ => false,
    }
}
