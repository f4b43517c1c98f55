//! The cache requests of the QUIC protocol, answered: a `Request::Cache` in, a
//! `Response::Cache` (a found value as the body) or an error out. Permissions were checked
//! before this runs (`auth::requests`: `cache.read`, `cache.write`, `cache.manage`).
//!
//! Decides where an operation on a key runs: here if this broker owns the key's shard,
//! else at the owner, forwarded once over the internal network (the owner checks the
//! caller's token again and never forwards further). Bad input is refused before anything
//! is looked up or written.

use bytes::Bytes;
use felix_meta::auth::Resource;
use felix_meta::model::ShardKey;
use felix_wire::cache::{CacheRequest, CacheResponse, MAX_KEY_BYTES, MAX_VALUE_BYTES};
use felix_wire::protocol::{ErrorBody, Frame, FrameKind, Request, Response, codes};

use crate::broker::Broker;
use crate::errors::err;

/// Answers one cache request (not a watch: `watch.rs` serves those); `forwarded` when
/// another broker sent it here on a client's behalf (it is then not forwarded again).
pub async fn serve(
    broker: &Broker,
    request: CacheRequest,
    body: Bytes,
    token: Option<&str>,
    forwarded: bool,
) -> (Response, Bytes) {
    let kind = request.kind();
    let mut result = answer(broker, &request, body.clone(), token, forwarded).await;
    if let Err(e) = &result {
        let unknown = e.code == codes::UNKNOWN_CACHE;
        let probe = err(codes::UNKNOWN_STREAM, "unknown_stream", "");
        // A cache another broker just created may not be applied here yet.
        if (unknown && broker.node.catch_up_if_unknown(&probe).await)
            || broker.node.catch_up_if_unknown(e).await
        {
            result = answer(broker, &request, body, token, forwarded).await;
        }
    }
    if !forwarded {
        let outcome = match &result {
            Ok(_) => "ok",
            Err(e) => e.reason.as_str(),
        };
        broker.node.metrics.cache.operation(kind, outcome);
    }
    match result {
        Ok((r, body)) => (Response::Cache(r), body),
        Err(e) => (Response::Error(e), Bytes::new()),
    }
}

fn invalid(message: String) -> ErrorBody {
    err(codes::INVALID_ARGUMENT, "invalid_argument", message)
}

/// Refuses a key that is empty or too long.
pub(crate) fn check_key(key: &str) -> Result<(), ErrorBody> {
    if key.is_empty() || key.len() > MAX_KEY_BYTES {
        return Err(invalid(format!(
            "a cache key is 1 to {MAX_KEY_BYTES} bytes of UTF-8, not {}",
            key.len()
        )));
    }
    Ok(())
}

/// Refuses what no broker would do, before anything is looked up.
fn check(request: &CacheRequest, body: &Bytes) -> Result<(), ErrorBody> {
    if let Some(key) = request.key() {
        check_key(key)?;
    }
    match request {
        CacheRequest::Put { ttl_ms, .. } => {
            if body.len() > MAX_VALUE_BYTES {
                return Err(err(
                    codes::VALUE_TOO_LARGE,
                    "value_too_large",
                    format!(
                        "a cache value is at most {MAX_VALUE_BYTES} bytes, not {}; keep large \
                         values in object storage and cache a reference",
                        body.len()
                    ),
                ));
            }
            if *ttl_ms == Some(0) {
                return Err(invalid(
                    "ttl_ms must be at least 1 (leave it out for no expiry)".into(),
                ));
            }
        }
        CacheRequest::Watch { key, prefix, .. } => match (key, prefix) {
            (Some(k), None) => check_key(k)?,
            (None, Some(_)) => {}
            _ => {
                return Err(invalid(
                    "a watch names exactly one of a key or a prefix".into(),
                ));
            }
        },
        _ => {}
    }
    Ok(())
}

async fn answer(
    broker: &Broker,
    request: &CacheRequest,
    body: Bytes,
    token: Option<&str>,
    forwarded: bool,
) -> Result<(CacheResponse, Bytes), ErrorBody> {
    check(request, &body)?;
    let none = |r: CacheResponse| Ok((r, Bytes::new()));
    match request {
        CacheRequest::Create {
            tenant,
            namespace,
            name,
            config,
        } => none(CacheResponse::Cache {
            cache: broker.create_cache(tenant, namespace, name, config).await?,
        }),
        CacheRequest::Describe {
            tenant,
            namespace,
            name,
        } => none(CacheResponse::Cache {
            cache: broker.describe_cache(tenant, namespace, name)?,
        }),
        CacheRequest::List { tenant, namespace } => none(CacheResponse::Caches {
            caches: broker.list_caches(tenant, namespace)?,
        }),
        CacheRequest::Drop {
            tenant,
            namespace,
            name,
        } => {
            broker.drop_cache(tenant, namespace, name).await?;
            none(CacheResponse::Done {})
        }
        CacheRequest::Watch { .. } => Err(invalid(
            "a watch is its own stream: send it as the first request of a stream".into(),
        )),
        _ => {
            let here = on_key_here(broker, request, body.clone()).await;
            // Forwarded once; once more if it was held here across a hand-over.
            let forward = match &here {
                Err(e) => !forwarded || super::moving::forward_again(e),
                Ok(_) => false,
            };
            match here {
                Err(e) if e.code == codes::NOT_LEADER && forward && broker.node.cluster => {
                    let leader = e.leader;
                    match leader.and_then(|l| broker.node.internal_addr_of(l)) {
                        Some(addr) => {
                            broker.node.metrics.cache.cache_forwarded.inc();
                            super::forward::forward(broker, &addr, request, body, token).await
                        }
                        None => Err(e),
                    }
                }
                other => other,
            }
        }
    }
}

/// An operation on one key, at this broker (refused with `not_leader` if another owns it).
async fn on_key_here(
    broker: &Broker,
    request: &CacheRequest,
    body: Bytes,
) -> Result<(CacheResponse, Bytes), ErrorBody> {
    let (tenant, namespace, cache) = request.cache();
    let Some(key) = request.key() else {
        return Err(invalid(format!("{} names no key", request.kind())));
    };
    let shard = broker.cache_shard_of(tenant, namespace, cache, key)?;
    // Held across a shard move's hand-over, and tried again if it raced the fence.
    broker
        .cache_held(&shard, || {
            on_key_once(broker, request, &shard, key, body.clone())
        })
        .await
}

/// One try of an operation on `key` of `shard`, at this broker.
async fn on_key_once(
    broker: &Broker,
    request: &CacheRequest,
    shard: &ShardKey,
    key: &str,
    body: Bytes,
) -> Result<(CacheResponse, Bytes), ErrorBody> {
    let none = |r: CacheResponse| Ok((r, Bytes::new()));
    match request {
        CacheRequest::Put {
            ttl_ms, condition, ..
        } => none(CacheResponse::Written {
            version: broker
                .cache_put_here(shard, key, body, *ttl_ms, *condition)
                .await?,
        }),
        CacheRequest::Get { .. } => match broker.cache_get_here(shard, key).await? {
            Some(found) => Ok((
                CacheResponse::Value {
                    found: true,
                    version: found.version,
                    ttl_ms: found.ttl_ms,
                },
                found.value,
            )),
            None => none(CacheResponse::Value {
                found: false,
                version: 0,
                ttl_ms: None,
            }),
        },
        CacheRequest::Delete { condition, .. } => none(CacheResponse::Deleted {
            existed: broker.cache_delete_here(shard, key, *condition).await?,
        }),
        CacheRequest::CounterAdd { delta, .. } => {
            let (value, version) = broker.counter_add_here(shard, key, *delta).await?;
            none(CacheResponse::Counter { value, version })
        }
        CacheRequest::CounterGet { .. } => {
            let (value, version) = broker.counter_get_here(shard, key).await?;
            none(CacheResponse::Counter { value, version })
        }
        _ => Err(invalid(format!(
            "{} is not an operation on a key",
            request.kind()
        ))),
    }
}

/// Serves an operation another broker forwarded here: the caller's token is checked again,
/// then it is answered as if the client had sent it here, and never forwarded again.
pub(crate) async fn serve_forwarded(
    broker: &Broker,
    headers: &axum::http::HeaderMap,
    body: Bytes,
) -> Bytes {
    let answer =
        |r: &Response, body: Bytes| Bytes::from(Frame::new(FrameKind::Response, r, body).encode());
    let refuse = |m: String| {
        answer(
            &Response::Error(ErrorBody::new(codes::BAD_REQUEST, "bad_request", m)),
            Bytes::new(),
        )
    };
    let frame = match Frame::decode_shared(&body, usize::MAX) {
        Ok((f, _)) => f,
        Err(e) => return refuse(format!("bad forwarded cache frame: {e}")),
    };
    let request = match frame.header::<Request>() {
        Ok(Request::Cache(r)) => r,
        Ok(_) => return refuse("a forwarded cache frame holds another request".into()),
        Err(e) => return refuse(format!("bad forwarded cache request: {e}")),
    };
    let token = headers
        .get(super::forward::TOKEN_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let access = broker.access();
    if access.enabled() {
        let (t, n, c) = request.cache();
        let resource = Resource::stream(t, n, c);
        let action = super::permissions::action_of(&request);
        let checked = match token.as_deref() {
            Some(token) => access
                .authenticate_cached(token)
                .and_then(|cred| access.authorize(Some(&cred), action, &resource)),
            None => access.authorize(None, action, &resource),
        };
        if let Err(error) = checked {
            broker.metrics().auth_refused(&error.reason);
            return answer(&Response::Error(error), Bytes::new());
        }
    }
    let (response, body) = serve(broker, request, frame.body, token.as_deref(), true).await;
    answer(&response, body)
}

/// The answer while the broker is starting: retryable, nothing done.
pub(crate) fn starting() -> Bytes {
    let e = ErrorBody::new(
        codes::SHARD_UNAVAILABLE,
        "starting",
        "the broker is starting",
    )
    .retry_after(500);
    Bytes::from(Frame::new(FrameKind::Response, &Response::Error(e), Bytes::new()).encode())
}
