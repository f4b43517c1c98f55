//! A [`Client`]'s cache calls: an operation on a key goes straight to the key's owner when
//! the routing table of the cache's stream names it, else to any live broker (which forwards
//! it to the owner), re-sent on refusals and, for reads, on unknown outcomes; and a watch
//! that follows the owner of each shard it covers.
//!
//! Invariant: a write whose outcome is unknown (lost connection, `quorum_timeout`,
//! `leadership_lost`) is never re-sent here: the caller decides, since a put may have
//! landed and a counter add is not idempotent.

use bytes::Bytes;
use felix_wire::cache::{CacheRequest, CacheResponse};
use felix_wire::protocol::{Request, Response};

use tokio::sync::mpsc;

use super::Client;
use super::retry::{Backoff, Verdict, classify};
use crate::WatchResume;
use crate::cache::{CacheEvent, CacheWatch, WatchTarget, reopenable};
use crate::{ClientError, Connection};

impl Client {
    async fn cache_call(
        &self,
        request: CacheRequest,
        body: Bytes,
        idempotent: bool,
    ) -> Result<(CacheResponse, Bytes), ClientError> {
        let timeout = self.inner.config.request_timeout;
        let request = Request::Cache(request);
        if let Some(answer) = self.at_owner(&request, &body).await {
            return answer;
        }
        let request = &request;
        let body = &body;
        let answer = self
            .on_any_broker(
                idempotent,
                &self.budget(),
                None,
                |c: Connection| async move { c.call_cache(request, body.clone(), timeout).await },
            )
            .await?;
        match answer {
            (Response::Cache(r), body) => Ok((r, body)),
            (other, _) => Err(crate::unexpected("Cache", &other)),
        }
    }

    cache_requests!();

    /// Sends an operation on a key straight to the key's owner, found in the routing table
    /// of the cache's stream: `None` when it cannot be routed there or the owner refused it
    /// (then any broker takes it and forwards it), else the answer — including a failure
    /// after sending, which is not re-sent here.
    async fn at_owner(
        &self,
        request: &Request,
        body: &Bytes,
    ) -> Option<Result<(CacheResponse, Bytes), ClientError>> {
        let Request::Cache(cache_request) = request else {
            return None;
        };
        let key = cache_request.key()?;
        let (t, n, c) = cache_request.cache();
        let stream = crate::stream_key(t, n, &format!("__cache.{c}"));
        let deadline = self.budget();
        let shards = self.shard_count_of(&stream, &deadline).await.ok()?;
        let shard = felix_wire::murmur2::shard_for_key(key.as_bytes(), shards);
        let (owner, _) = self.leader_client(&stream, shard, &deadline).await.ok()?;
        match owner
            .call_cache(request, body.clone(), self.inner.config.request_timeout)
            .await
        {
            Ok((Response::Cache(r), body)) => Some(Ok((r, body))),
            Ok((other, _)) => Some(Err(crate::unexpected("Cache", &other))),
            // Refused (not the owner any more, between owners, not sent): any broker
            // routes it; the table learns the new owner on its next refresh.
            Err(failed) if classify(&failed.error, failed.sent) == Verdict::Refused => {
                self.routes().forget(&stream);
                None
            }
            Err(failed) => Some(Err(failed.error)),
        }
    }

    /// Watches a key (at its owner) or a prefix; the watch follows the owner: when the
    /// owner changes or its connection is lost, it is opened again at the new owner, which
    /// replays the changes made since the one heard last (log-backed caches: nothing is
    /// missed, or the watch ends with `watch_lagged`/`watch_diverged`; an in-memory cache's
    /// changes made while it was reopened are not delivered). A prefix of a cache of
    /// several shards is watched one shard at a time, each at its own owner, so the shards
    /// may be owned by different brokers; changes come in order within a shard.
    pub async fn watch_cache(
        &self,
        tenant: &str,
        namespace: &str,
        cache: &str,
        target: WatchTarget,
    ) -> Result<ClusterCacheWatch, ClientError> {
        let scope = (tenant.to_owned(), namespace.to_owned(), cache.to_owned());
        let shards = match &target {
            WatchTarget::Key(_) => 1,
            WatchTarget::Prefix(_) => {
                let stream = crate::stream_key(tenant, namespace, &format!("__cache.{cache}"));
                // Unknown to the routing table: the broker answers (`unknown_cache`, or
                // the whole-cache watch when it exists).
                self.shard_count_of(&stream, &self.budget())
                    .await
                    .unwrap_or(1)
            }
        };
        let mut parts = Vec::new();
        for shard in 0..shards {
            let shard = (shards > 1).then_some(shard);
            let current = self.open_watch(&scope, &target, shard, None).await?;
            parts.push(WatchPart {
                client: self.clone(),
                scope: scope.clone(),
                target: target.clone(),
                shard,
                current: Some(current),
                resume: None,
            });
        }
        if parts.len() == 1 {
            let part = parts.pop().expect("one part");
            return Ok(ClusterCacheWatch {
                parts: Parts::One(Box::new(part)),
            });
        }
        // One task per shard, each following its own owner, into one channel.
        let (tx, events) = mpsc::channel(1024);
        let tasks = parts
            .into_iter()
            .map(|mut part| {
                let tx = tx.clone();
                tokio::spawn(async move {
                    loop {
                        let next = part.next_change().await;
                        let end = next.is_err();
                        if tx.send(next).await.is_err() || end {
                            return;
                        }
                    }
                })
            })
            .collect();
        Ok(ClusterCacheWatch {
            parts: Parts::Many { events, tasks },
        })
    }

    /// Opens a watch at the broker that owns its shard(s), following `not_leader`.
    async fn open_watch(
        &self,
        (t, n, c): &(String, String, String),
        target: &WatchTarget,
        shard: Option<u32>,
        resume: Option<WatchResume>,
    ) -> Result<CacheWatch, ClientError> {
        let deadline = self.budget();
        let mut backoff = Backoff::new();
        let mut conn = self.any_connection().await?;
        loop {
            let opened = match (resume, shard, target) {
                (Some(r), _, _) => conn.resume_watch((t, n, c), target.clone(), shard, r).await,
                (None, Some(shard), WatchTarget::Prefix(p)) => {
                    conn.watch_cache_shard((t, n, c), p, shard).await
                }
                _ => conn.watch_cache(t, n, c, target.clone()).await,
            };
            let error = match opened {
                Ok(w) => return Ok(w),
                Err(e) => e,
            };
            if !reopenable(&error) {
                return Err(error);
            }
            let hint = match &error {
                ClientError::Broker(b) => b.leader.zip(b.leader_addr.clone()),
                _ => None,
            };
            if let Some((id, addr)) = hint
                && let Ok(owner) = self.inner.pool.get(id, &addr, &deadline).await
            {
                conn = owner;
                continue;
            }
            let wait = backoff.next_delay(&error);
            if !deadline.allows(wait) {
                return Err(error);
            }
            tokio::time::sleep(wait).await;
            conn = self.any_connection().await?;
        }
    }
}

/// A watch through a [`Client`]: opened again at the new owner when a shard's owner
/// changes, resuming after the change heard last (log-backed caches).
#[derive(Debug)]
pub struct ClusterCacheWatch {
    parts: Parts,
}

#[derive(Debug)]
enum Parts {
    /// A key, or a prefix of a one-shard cache: one watch.
    One(Box<WatchPart>),
    /// A prefix of a cache of several shards: one watch per shard, each fed in by a task.
    Many {
        events: mpsc::Receiver<Result<CacheEvent, ClientError>>,
        tasks: Vec<tokio::task::JoinHandle<()>>,
    },
}

impl Drop for ClusterCacheWatch {
    fn drop(&mut self) {
        if let Parts::Many { tasks, .. } = &self.parts {
            for t in tasks {
                t.abort();
            }
        }
    }
}

impl ClusterCacheWatch {
    /// The next change; `Err` when the watch ended for good (the cache was dropped, it
    /// lagged, the token lapsed, or no owner answered within the request timeout).
    pub async fn next_change(&mut self) -> Result<CacheEvent, ClientError> {
        match &mut self.parts {
            Parts::One(part) => part.next_change().await,
            Parts::Many { events, .. } => events.recv().await.unwrap_or_else(|| {
                Err(ClientError::Transport(
                    "every shard's watch has ended".into(),
                ))
            }),
        }
    }
}

/// The watch of one shard (or of a key), reopened at the owner when it changes.
#[derive(Debug)]
struct WatchPart {
    client: Client,
    scope: (String, String, String),
    target: WatchTarget,
    shard: Option<u32>,
    current: Option<CacheWatch>,
    /// After the change heard last (log-backed caches): where a reopened watch resumes.
    resume: Option<WatchResume>,
}

impl WatchPart {
    async fn next_change(&mut self) -> Result<CacheEvent, ClientError> {
        loop {
            let result = match self.current.as_mut() {
                Some(w) => w.next_change().await,
                None => Err(ClientError::Transport("the watch is being reopened".into())),
            };
            match result {
                Ok(Some(event)) => {
                    self.resume = event.resume_after();
                    return Ok(event);
                }
                Ok(None) => {
                    self.current = None;
                }
                Err(e) if reopenable(&e) => {
                    self.current = None;
                }
                Err(e) => return Err(e),
            }
            self.current = Some(
                self.client
                    .open_watch(&self.scope, &self.target, self.shard, self.resume)
                    .await?,
            );
        }
    }
}
