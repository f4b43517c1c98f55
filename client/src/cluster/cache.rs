//! A [`Client`]'s cache calls: each goes to any live broker (the broker forwards an
//! operation on a key to the key's owner), re-sent on refusals and, for reads, on unknown
//! outcomes; and a watch that follows the key's owner.
//!
//! Invariant: a write whose outcome is unknown (lost connection, `quorum_timeout`,
//! `leadership_lost`) is never re-sent here: the caller decides, since a put may have
//! landed and a counter add is not idempotent.

use bytes::Bytes;
use felix_wire::cache::{CacheRequest, CacheResponse};
use felix_wire::protocol::{Request, Response};

use super::Client;
use super::retry::Backoff;
use crate::cache::{CacheEvent, CacheWatch, WatchTarget, reopenable};
use crate::{ClientError, Connection};

impl Client {
    async fn cache_call(
        &self,
        request: CacheRequest,
        body: Bytes,
        idempotent: bool,
    ) -> Result<(CacheResponse, Bytes), ClientError> {
        let request = &Request::Cache(request);
        let body = &body;
        let timeout = self.inner.config.request_timeout;
        let answer = self
            .on_any_broker(idempotent, &self.budget(), None, |c: Connection| async move {
                c.call_with_body(request, body.clone(), timeout).await
            })
            .await?;
        match answer {
            (Response::Cache(r), body) => Ok((r, body)),
            (other, _) => Err(crate::unexpected("Cache", &other)),
        }
    }

    cache_requests!();

    /// Watches a key (at its owner) or a prefix; the watch follows the owner: when the
    /// owner changes or its connection is lost, it is opened again at the new owner.
    /// Changes made while it was being reopened are not delivered.
    pub async fn watch_cache(
        &self,
        tenant: &str,
        namespace: &str,
        cache: &str,
        target: WatchTarget,
    ) -> Result<ClusterCacheWatch, ClientError> {
        let scope = (tenant.to_owned(), namespace.to_owned(), cache.to_owned());
        let current = self.open_watch(&scope, &target).await?;
        Ok(ClusterCacheWatch {
            client: self.clone(),
            scope,
            target,
            current: Some(current),
        })
    }

    /// Opens a watch at the broker that owns its shards, following `not_leader`.
    async fn open_watch(
        &self,
        (t, n, c): &(String, String, String),
        target: &WatchTarget,
    ) -> Result<CacheWatch, ClientError> {
        let deadline = self.budget();
        let mut backoff = Backoff::new();
        let mut conn = self.any_connection().await?;
        loop {
            let error = match conn.watch_cache(t, n, c, target.clone()).await {
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

/// A watch through a [`Client`]: opened again at the key's new owner when the owner
/// changes (changes made in between are not delivered).
#[derive(Debug)]
pub struct ClusterCacheWatch {
    client: Client,
    scope: (String, String, String),
    target: WatchTarget,
    current: Option<CacheWatch>,
}

impl ClusterCacheWatch {
    /// The next change; `Err` when the watch ended for good (the cache was dropped, it
    /// lagged, the token lapsed, or no owner answered within the request timeout).
    pub async fn next_change(&mut self) -> Result<CacheEvent, ClientError> {
        loop {
            let result = match self.current.as_mut() {
                Some(w) => w.next_change().await,
                None => Err(ClientError::Transport("the watch is being reopened".into())),
            };
            match result {
                Ok(Some(event)) => return Ok(event),
                Ok(None) => {
                    self.current = None;
                }
                Err(e) if reopenable(&e) => {
                    self.current = None;
                }
                Err(e) => return Err(e),
            }
            self.current = Some(self.client.open_watch(&self.scope, &self.target).await?);
        }
    }
}
