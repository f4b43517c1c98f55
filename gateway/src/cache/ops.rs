//! The operations on keys, at the shard's owner: put, get, delete, counter add and get,
//! and the conditional put and delete.
//!
//! Decides what an acknowledgement means. Every change is made under the shard's lock:
//! the state is brought up to date with the log, the condition is checked against it, the
//! change is accepted by the log at the state's end and applied (`commit.rs`). After the
//! lock is released the change's write is waited for (under the fsync policy; a write the
//! storage refuses is answered as an error), then a replicated shard settles the answer: a
//! Quorum cache waits until a majority holds the write and the owner still leads
//! (`quorum_timeout` / `leadership_lost` otherwise: outcome unknown); a Leader cache
//! re-checks the lease. A Quorum read waits until a majority holds everything up to the
//! state it read, then confirms the owner still leads.

use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use felix_meta::model::ShardKey;
use felix_wire::cache::Condition;
use felix_wire::protocol::{ErrorBody, codes};

use super::record::LogOp;
use super::state::{KvState, check_condition, counter_value};
use super::{CacheShard, now_ms};
use crate::broker::Broker;
use crate::errors::err;

/// A value found by a get.
#[derive(Debug, Clone)]
pub(crate) struct Found {
    pub value: Bytes,
    pub version: u64,
    /// Left of the TTL (none: no expiry).
    pub ttl_ms: Option<u64>,
}

impl Broker {
    /// After the lock: what a replicated shard owes before it acknowledges a write.
    async fn settle_write(&self, cs: &CacheShard, last: Option<u64>) -> Result<(), ErrorBody> {
        let Some(repl) = &cs.shard.repl else {
            return Ok(());
        };
        let generation = repl.leading();
        if let Some(last) = last {
            self.await_replicated(&cs.shard, last, cs.quorum).await?;
        }
        if cs.quorum && (!self.node.lease.holds() || repl.leading() != generation) {
            return Err(err(
                codes::LEADERSHIP_LOST,
                "leadership_lost",
                format!(
                    "shard {}: this broker lost the shard before the write was confirmed; its \
                     outcome is unknown",
                    cs.key
                ),
            )
            .retry_after(500));
        }
        // Applied already: past a lapsed lease the outcome is unknown, not refused (a
        // refusal would have a client apply a counter add twice).
        if last.is_none() && !self.node.lease.holds() {
            return Err(crate::publish::unvouched(&cs.key));
        }
        Ok(())
    }

    /// After the lock: what a replicated shard owes before it answers a read of the state
    /// up to `tail` (one past the last log offset it reflects).
    async fn settle_read(&self, cs: &CacheShard, tail: u64) -> Result<(), ErrorBody> {
        let Some(repl) = &cs.shard.repl else {
            return Ok(());
        };
        if cs.quorum && cs.durable && tail > 0 {
            let wait = Duration::from_millis(self.node.config.publish_quorum_timeout_ms);
            if !repl.mark.wait_past(tail - 1, wait).await {
                self.node.metrics.quorum_timeouts.inc();
                return Err(err(
                    codes::QUORUM_TIMEOUT,
                    "quorum_timeout",
                    format!(
                        "shard {}: no majority confirmed the state this read saw within {wait:?}",
                        cs.key
                    ),
                )
                .retry_after(500));
            }
        }
        if !self.node.lease.holds() || repl.leading().is_none() {
            return Err(fenced(cs));
        }
        Ok(())
    }

    /// `cache_put` / `cache_put_if`: the new version.
    pub(crate) async fn cache_put_here(
        &self,
        key: &ShardKey,
        k: &str,
        value: Bytes,
        ttl_ms: Option<u64>,
        condition: Option<Condition>,
    ) -> Result<u64, ErrorBody> {
        let cs = self.cache_shard(key)?;
        let (version, last) = {
            let mut st = cs.state.lock().await;
            self.catch_up(&cs, &mut st).await?;
            let now = now_ms();
            check_condition(condition, st.live(k, now), k)?;
            let version = st.next_version();
            let before = st.bytes();
            let op = LogOp::Put {
                key: k.to_owned(),
                value,
                version,
                expires_at: ttl_ms.map(|t| now.saturating_add(t)),
            };
            let staged = self.stage_changes(&cs, &mut st, vec![op]).await?;
            if !cs.durable {
                self.account_memory(&cs, &mut st, before, k, now);
            }
            (version, staged)
        };
        let last = last.written(&cs).await?;
        self.settle_write(&cs, last).await?;
        Ok(version)
    }

    /// An in-memory shard's bytes against the broker's `kv_memory_bytes`: past it, other
    /// entries of the shard go (best-effort, no order promised).
    fn account_memory(&self, cs: &CacheShard, st: &mut KvState, before: u64, keep: &str, now: u64) {
        let after = st.bytes();
        let total = if after >= before {
            self.caches
                .memory
                .fetch_add(after - before, Ordering::AcqRel)
                + (after - before)
        } else {
            self.release_memory(before - after);
            return;
        };
        let budget = self.node.config.kv_memory_bytes;
        if total <= budget {
            return;
        }
        let held = st.bytes();
        let target = held.saturating_sub(total - budget);
        let evicted = st.evict_to(target, keep, now);
        self.release_memory(held - st.bytes());
        if evicted > 0 {
            self.node
                .metrics
                .cache
                .evicted(&cs.key, &cs.cache, evicted as u64);
        }
    }

    /// `cache_get`: the unexpired value, if any.
    pub(crate) async fn cache_get_here(
        &self,
        key: &ShardKey,
        k: &str,
    ) -> Result<Option<Found>, ErrorBody> {
        let cs = self.cache_shard(key)?;
        let (found, tail, lost) = {
            let mut st = cs.state.lock().await;
            self.catch_up(&cs, &mut st).await?;
            let now = now_ms();
            let found = st.live(k, now).map(|e| Found {
                value: e.value.clone(),
                version: e.version,
                ttl_ms: e.expires_at.map(|x| x.saturating_sub(now)),
            });
            // An in-memory cache expires lazily: an expired entry goes when it is read.
            if found.is_none() && !cs.durable && st.remove(k).is_some() {
                self.node.metrics.cache.expired(&cs.key, &cs.cache, 1);
            }
            (found, st.applied_end, cs.lost.load(Ordering::Acquire))
        };
        self.wait_written(&cs, tail, lost).await?;
        self.settle_read(&cs, tail).await?;
        Ok(found)
    }

    /// `cache_delete` / `cache_delete_if`: whether there was a value.
    pub(crate) async fn cache_delete_here(
        &self,
        key: &ShardKey,
        k: &str,
        condition: Option<Condition>,
    ) -> Result<bool, ErrorBody> {
        let cs = self.cache_shard(key)?;
        let (existed, last) = {
            let mut st = cs.state.lock().await;
            self.catch_up(&cs, &mut st).await?;
            let now = now_ms();
            let current = st.live(k, now);
            check_condition(condition, current, k)?;
            if current.is_none() {
                (false, None)
            } else {
                let before = st.bytes();
                let op = LogOp::Delete {
                    key: k.to_owned(),
                    version: st.next_version(),
                    expired: false,
                };
                let staged = self.stage_changes(&cs, &mut st, vec![op]).await?;
                if !cs.durable {
                    self.release_memory(before.saturating_sub(st.bytes()));
                }
                (true, Some(staged))
            }
        };
        let last = match last {
            Some(staged) => staged.written(&cs).await?,
            None => None,
        };
        self.settle_write(&cs, last).await?;
        Ok(existed)
    }

    /// `counter_add`: the counter's new value and version. The add is made at the owner
    /// under the shard's lock, so concurrent adds through any broker never lose one.
    pub(crate) async fn counter_add_here(
        &self,
        key: &ShardKey,
        k: &str,
        delta: i64,
    ) -> Result<(i64, u64), ErrorBody> {
        let cs = self.cache_shard(key)?;
        let (value, version, last) = {
            let mut st = cs.state.lock().await;
            self.catch_up(&cs, &mut st).await?;
            let now = now_ms();
            let current = st.live(k, now);
            let value = counter_value(current, k)?
                .checked_add(delta)
                .ok_or_else(|| {
                    err(
                        codes::NOT_A_COUNTER,
                        "not_a_counter",
                        format!("adding {delta} to counter {k:?} would overflow 64 bits"),
                    )
                })?;
            // A counter keeps the expiry it has (as Redis's INCR does).
            let expires_at = current.and_then(|e| e.expires_at);
            let version = st.next_version();
            let before = st.bytes();
            let op = LogOp::Put {
                key: k.to_owned(),
                value: Bytes::from(value.to_string()),
                version,
                expires_at,
            };
            let staged = self.stage_changes(&cs, &mut st, vec![op]).await?;
            if !cs.durable {
                self.account_memory(&cs, &mut st, before, k, now);
            }
            (value, version, staged)
        };
        let last = last.written(&cs).await?;
        self.settle_write(&cs, last).await?;
        Ok((value, version))
    }

    /// `counter_get`: the counter's value (0 when absent) and version (0 when absent).
    pub(crate) async fn counter_get_here(
        &self,
        key: &ShardKey,
        k: &str,
    ) -> Result<(i64, u64), ErrorBody> {
        let found = self.cache_get_here(key, k).await?;
        let value = counter_value(
            found
                .as_ref()
                .map(|f| super::state::Entry {
                    value: f.value.clone(),
                    version: f.version,
                    expires_at: None,
                })
                .as_ref(),
            k,
        )?;
        Ok((value, found.map_or(0, |f| f.version)))
    }
}

/// `shard_unavailable` (`fenced`): the owner's lease lapsed, so another broker may own
/// the shard by now.
fn fenced(cs: &CacheShard) -> ErrorBody {
    err(
        codes::SHARD_UNAVAILABLE,
        "fenced",
        format!(
            "shard {}: this broker's lease lapsed, so another broker may own the shard by now",
            cs.key
        ),
    )
    .retry_after(500)
}
