//! Watches: a stream of the changes to one key, or to every key with a prefix, served by
//! the broker that owns the shards concerned.
//!
//! Decides what a watch sees and when it ends. A watch hears every change its owner
//! applies from the moment it is opened — puts and counter adds (with the new value),
//! deletes, and the expiry deletes of a log-backed cache — in the order the owner applied
//! them on each shard. It ends with an `End` frame when the owner stops owning a shard
//! (`shard_moved` after a move's hand-over, `not_leader`, naming the new owner when known,
//! or `shard_unavailable`), when the cache
//! is dropped, when it falls more than the buffer behind (`watch_lagged`: changes were
//! missed), or when the caller's token lapses. A watch is not forwarded: a broker that does
//! not own a key's shard refuses with `not_leader` and the client opens it at the owner. A
//! prefix watch covers every shard of the cache when this broker owns them all; one that
//! names a shard covers that shard only, so a client follows a prefix across owners with
//! one watch per shard (the all-shards form is refused with `prefix_watch_across_brokers`
//! otherwise). A watch of one shard may resume after the change it heard last: the owner
//! replays its log from there first (`resume.rs`).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use felix_wire::cache::{CacheRequest, CacheResponse};
use felix_wire::protocol::{ErrorBody, Event, Frame, FrameKind, Response, codes};
use tokio::sync::{broadcast, mpsc};

use super::{CacheShard, Change, backing_stream, unknown_cache};
use crate::auth::Credential;
use crate::broker::Broker;
use crate::errors::err;
use crate::shard::shard_key;

/// What a watch matches.
#[derive(Debug, Clone)]
enum Filter {
    Key(String),
    Prefix(String),
}

impl Filter {
    fn matches(&self, key: &str) -> bool {
        match self {
            Filter::Key(k) => k == key,
            Filter::Prefix(p) => key.starts_with(p.as_str()),
        }
    }
}

async fn respond(send: &mut quinn::SendStream, response: &Response) -> bool {
    let frame = Frame::new(FrameKind::Response, response, Bytes::new());
    send.write_all(&frame.encode()).await.is_ok()
}

/// The cache shards a watch needs, each owned here (else the refusal to send).
fn shards_of(
    broker: &Broker,
    request: &CacheRequest,
) -> Result<(Filter, Vec<Arc<CacheShard>>), ErrorBody> {
    let CacheRequest::Watch {
        tenant,
        namespace,
        cache,
        key,
        prefix,
        shard,
        resume,
    } = request
    else {
        return Err(err(codes::BAD_REQUEST, "bad_request", "not a watch"));
    };
    let (filter, keys) = match (key, prefix) {
        (Some(_), None) if shard.is_some() => {
            return Err(err(
                codes::INVALID_ARGUMENT,
                "invalid_argument",
                "a key watch names no shard: the key names it",
            ));
        }
        (Some(k), None) => {
            super::requests::check_key(k)?;
            let shard = broker.cache_shard_of(tenant, namespace, cache, k)?;
            (Filter::Key(k.clone()), vec![shard])
        }
        (None, Some(p)) => {
            let stream = backing_stream(cache);
            let (_, settings) = broker
                .node
                .stream_settings(tenant, namespace, &stream)
                .map_err(|_| unknown_cache(tenant, namespace, cache))?;
            let keys = match *shard {
                None => (0..settings.shards)
                    .map(|k| shard_key(tenant, namespace, &stream, k))
                    .collect(),
                Some(k) if k < settings.shards => vec![shard_key(tenant, namespace, &stream, k)],
                Some(k) => {
                    return Err(err(
                        codes::INVALID_ARGUMENT,
                        "invalid_argument",
                        format!(
                            "cache {tenant}/{namespace}/{cache} has {} shards; there is no \
                             shard {k}",
                            settings.shards
                        ),
                    ));
                }
            };
            (Filter::Prefix(p.clone()), keys)
        }
        _ => {
            return Err(err(
                codes::INVALID_ARGUMENT,
                "invalid_argument",
                "a watch names exactly one of a key or a prefix",
            ));
        }
    };
    let mut shards = Vec::with_capacity(keys.len());
    for k in &keys {
        match broker.cache_shard(k) {
            Ok(cs) => shards.push(cs),
            Err(e) if keys.len() > 1 && e.code == codes::NOT_LEADER => {
                return Err(err(
                    codes::INVALID_ARGUMENT,
                    "prefix_watch_across_brokers",
                    format!(
                        "cache {tenant}/{namespace}/{cache}: its shards are owned by several \
                         brokers; watch the prefix one shard at a time, each at its owner (as \
                         the cluster client does) ({})",
                        e.message
                    ),
                ));
            }
            Err(e) => return Err(e),
        }
    }
    if resume.is_some() && shards.len() != 1 {
        return Err(err(
            codes::INVALID_ARGUMENT,
            "invalid_argument",
            "a watch resumes one shard: a key, or a prefix that names its shard",
        ));
    }
    Ok((filter, shards))
}

/// Whether this broker still owns the shard (led at `opened` when the watch opened), as a
/// watch's end if not.
fn still_owned(broker: &Broker, cs: &CacheShard, opened: Option<u64>) -> Result<(), ErrorBody> {
    if cs.shard.is_closed() {
        return Err(err(
            codes::UNKNOWN_CACHE,
            "cache_dropped",
            format!(
                "shard {} was closed (cache dropped or broker stopping)",
                cs.key
            ),
        ));
    }
    // Handed over by a move: `shard_moved`, naming the new owner.
    if let Some(e) = super::moving::watch_end(&broker.node, &cs.shard, opened) {
        return Err(e);
    }
    crate::routing::check_leading(&broker.node, &cs.shard)?;
    if cs.shard.repl.is_some() && !broker.node.lease.holds() {
        return Err(err(
            codes::SHARD_UNAVAILABLE,
            "fenced",
            format!("shard {}: this broker's lease lapsed", cs.key),
        )
        .retry_after(500));
    }
    Ok(())
}

/// Serves a watch on its own QUIC stream until it ends (see the module doc).
pub(crate) async fn serve_watch(
    send: &mut quinn::SendStream,
    broker: &Broker,
    credential: Option<&Credential>,
    request: CacheRequest,
) {
    let resume = match &request {
        CacheRequest::Watch { resume, .. } => *resume,
        _ => None,
    };
    let (filter, shards) = match shards_of(broker, &request) {
        Ok(s) => s,
        Err(e) => {
            broker.node.metrics.cache.operation("watch", &e.reason);
            respond(send, &Response::Error(e)).await;
            return;
        }
    };
    broker.node.metrics.cache.operation("watch", "ok");
    // One task per shard feeds the watch; they end when the watch goes away.
    let (tx, mut rx) = mpsc::channel::<Result<Change, ErrorBody>>(1024);
    // The generation each shard is led at as the watch opens: a move ends the watch.
    let opened: Vec<Option<u64>> = shards
        .iter()
        .map(|cs| cs.shard.repl.as_ref().and_then(|r| r.leading()))
        .collect();
    for (cs, &led) in shards.iter().zip(&opened) {
        // Subscribed before the log is read for a resume, so no change falls between.
        let mut changes = cs.changes.subscribe();

        let mut role = cs.shard.repl.as_ref().map(|r| r.role.subscribe());
        let (node, shard) = (broker.node.clone(), cs.shard.clone());
        let tx = tx.clone();
        let filter = filter.clone();
        let cs = cs.clone();
        tokio::spawn(async move {
            // A live change at an offset below this was replayed already.
            let mut live_from = 0;
            if let Some(r) = resume {
                match super::resume::replay_since(&cs, r).await {
                    Ok((replayed, end)) => {
                        live_from = end;
                        for c in replayed
                            .into_iter()
                            .filter(|c| filter.matches(&c.change.key))
                        {
                            if tx.send(Ok(c)).await.is_err() {
                                return;
                            }
                        }
                    }
                    Err(e) => {
                        let _ = tx.send(Err(e)).await;
                        return;
                    }
                }
            }
            loop {
                let next = tokio::select! {
                    next = changes.recv() => next,
                    () = super::moving::role_changed(&mut role) => {
                        match super::moving::watch_end(&node, &shard, led) {
                            Some(e) => {
                                let _ = tx.send(Err(e)).await;
                                return;
                            }
                            None => continue,
                        }
                    }
                };
                let item = match next {
                    Ok(c) if !filter.matches(&c.change.key) => continue,
                    Ok(c) if c.change.offset.is_some_and(|o| o < live_from) => continue,
                    Ok(c) => Ok(c),
                    Err(broadcast::error::RecvError::Lagged(n)) => Err(err(
                        codes::SUBSCRIPTION_LAGGED,
                        "watch_lagged",
                        format!("the watch fell {n} changes behind and missed them; open it again"),
                    )),
                    Err(broadcast::error::RecvError::Closed) => return,
                };
                let end = item.is_err();
                if tx.send(item).await.is_err() || end {
                    return;
                }
            }
        });
    }
    drop(tx);
    if !respond(send, &Response::Cache(CacheResponse::Watching {})).await {
        return;
    }
    let stopped = send.stopped();
    tokio::pin!(stopped);
    let mut recheck = tokio::time::interval(Duration::from_millis(500));
    recheck.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let checking = broker.access().enabled();
    let end = loop {
        let item = tokio::select! {
            item = rx.recv() => item,
            _ = &mut stopped => return,
            _ = recheck.tick() => {
                if checking && let Err(e) = broker.access().still_live(credential) {
                    break e;
                }
                let mut owned = shards.iter().zip(&opened);
                if let Some(e) = owned.find_map(|(cs, o)| still_owned(broker, cs, *o).err()) {
                    break e;
                }
                continue;
            }
        };
        match item {
            Some(Ok(c)) => {
                let frame = Frame::new(FrameKind::Event, &Event::CacheChange(c.change), c.value);
                let mut chunks = [Bytes::from(frame.encode_head()), frame.body.clone()];
                if send.write_all_chunks(&mut chunks).await.is_err() {
                    return;
                }
            }
            Some(Err(e)) => break e,
            None => {
                break err(
                    codes::UNKNOWN_CACHE,
                    "cache_dropped",
                    "the cache's shards were closed (cache dropped or broker stopping)",
                );
            }
        }
    };
    let frame = Frame::new(FrameKind::Event, &Event::End(end), Bytes::new());
    let _ = send.write_all(&frame.encode()).await;
}
