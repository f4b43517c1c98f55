//! The cache (docs/cache.md): keys routed to one owner, Leader or Quorum, TTL, counters,
//! conditional writes, watches; in memory or log-backed with compaction.
//!
//! A cache is a stream of its own kind: the control plane holds it as a stream named
//! `__cache.<name>` ([`backing_stream`]) whose settings are the cache's (durability,
//! consistency, shards, replicas), so placement, leadership, leases, replication and the
//! forwarding to a shard's owner are the streams' own. A key hashes to one shard
//! (murmur2, as a keyed publish does); the broker leading that shard owns the key.
//!
//! * [`names`] — how a cache is named in the control plane (`__cache.<name>`).
//! * `registry.rs` — the cache shards open on this broker.
//! * `permissions.rs` — which permission each request needs.
//! * [`state`] — a shard's entries at its owner: what a read sees, how a change applies.
//! * [`record`] — a change as a log record (log-backed caches).
//! * `replay.rs` — rebuilding a shard's state from its log (restart, new owner).
//! * `ops.rs` — put, get, delete, counters and conditional writes at the owner.
//! * `commit.rs` — a change staged in order under the shard's lock, written outside it.
//! * `admin.rs` — create, describe, list and drop.
//! * `requests.rs` — the QUIC requests (and those forwarded here), answered here or
//!   forwarded to the owner.
//! * `forward.rs` — sending a key's operation to its owner over the internal network.
//! * `moving.rs` — operations held across a shard move's hand-over, and a watch's
//!   `shard_moved` end.
//! * `segments.rs` — how big a shard's log segments are, on its owner and followers.
//! * `sweep.rs` — the once-a-second pass: expiry deletes, compaction, gauges.
//! * `watch.rs` — watches: a stream of changes to a key or a prefix.
//! * `resume.rs` — a watch resumed after the change it heard last, replayed from the log.
//! * [`metrics`] — the cache metrics.
//!
//! Invariant: a shard's entries change only at the broker leading the shard, under the
//! shard's lock, in the order the log accepts its changes (log-backed) — so one owner
//! applies each key's changes in order and no write is torn — and nothing is answered from
//! a log-backed change until its record is written: neither its writer's acknowledgement,
//! nor a read that saw it, nor a watch (`commit.rs`).

pub(crate) mod admin;
pub(crate) mod commit;
pub(crate) mod forward;
pub mod metrics;
pub(crate) mod moving;
pub mod names;
pub(crate) mod ops;
pub(crate) mod permissions;
pub(crate) mod record;
pub(crate) mod registry;
pub(crate) mod replay;
pub mod requests;
pub(crate) mod resume;
pub(crate) mod segments;
pub(crate) mod state;
pub mod sweep;
pub(crate) mod watch;

use std::sync::Arc;

use felix_meta::model::{Consistency, Durability, ShardKey};
use felix_wire::protocol::{ErrorBody, codes};
use tokio::sync::broadcast;

use crate::broker::Broker;
use crate::errors::err;
use crate::shard::shard_key;
pub use names::{CACHE_STREAM_PREFIX, backing_stream, is_cache_stream};
pub(crate) use registry::{CacheShard, Change, WATCH_BUFFER};
use state::KvState;

/// Milliseconds since the Unix epoch: expiries are absolute, so they survive a restart.
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// `unknown_cache` for a cache that does not exist.
pub(crate) fn unknown_cache(tenant: &str, namespace: &str, name: &str) -> ErrorBody {
    err(
        codes::UNKNOWN_CACHE,
        "unknown_cache",
        format!("unknown cache {tenant}/{namespace}/{name}"),
    )
}

impl Broker {
    /// The shard of cache `name` that holds `key`, and the cache's shard count.
    pub(crate) fn cache_shard_of(
        &self,
        tenant: &str,
        namespace: &str,
        name: &str,
        key: &str,
    ) -> Result<ShardKey, ErrorBody> {
        let stream = backing_stream(name);
        let shards = self
            .node
            .stream_entry(tenant, namespace, &stream, |s| s.settings.shards)
            .map_err(|e| match e.code {
                codes::UNKNOWN_STREAM => unknown_cache(tenant, namespace, name),
                _ => e,
            })?;
        let shard = felix_wire::murmur2::shard_for_key(key.as_bytes(), shards);
        Ok(shard_key(tenant, namespace, &stream, shard))
    }

    /// The state of a cache shard this broker leads (opened on first use; a re-created
    /// cache's shard is another one). Refuses with `not_leader` where another broker leads.
    pub(crate) fn cache_shard(&self, key: &ShardKey) -> Result<Arc<CacheShard>, ErrorBody> {
        let (shard, settings) = self.shard(key)?;
        let mut open = self.caches.open.lock();
        if let Some(c) = open.get(key)
            && Arc::ptr_eq(&c.shard, &shard)
        {
            return Ok(c.clone());
        }
        let c = Arc::new(CacheShard {
            key: key.clone(),
            cache: key.stream[CACHE_STREAM_PREFIX.len().min(key.stream.len())..].to_owned(),
            shard,
            durable: settings.durability == Durability::Durable,
            quorum: settings.consistency == Consistency::Quorum,
            state: tokio::sync::Mutex::new(KvState::default()),
            changes: broadcast::channel(WATCH_BUFFER).0,
            unwritten: Default::default(),
            lost: Default::default(),
        });
        self.node.metrics.cache.seed_cache(key, &c.cache);
        if let Some(old) = open.insert(key.clone(), c.clone()) {
            self.forget_memory(&old);
        }
        Ok(c)
    }

    /// Gives back the memory an in-memory shard's state held (the shard is gone or
    /// re-created).
    pub(crate) fn forget_memory(&self, old: &CacheShard) {
        if old.durable {
            return;
        }
        if let Ok(st) = old.state.try_lock() {
            self.release_memory(st.bytes());
        }
    }
}
