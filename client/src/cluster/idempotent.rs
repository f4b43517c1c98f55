//! The idempotent producer of a cluster client: each shard's batches carry the producer id
//! and the shard's next sequence (as [`crate::IdempotentProducer`]'s), so a batch whose
//! outcome is unknown — the leader killed mid-request, `quorum_timeout` — is re-sent, to
//! whichever broker leads the shard by then, and lands once: a leader answers a sequence it
//! already holds with the offsets it gave it.
//!
//! Invariant: one batch per shard is in flight at a time (a shard's sequence slot is held
//! from encoding to the final answer), so a shard's batches land in sequence order. A
//! shard's sequence advances past a batch unless the batch certainly was not written; after
//! a batch whose outcome stayed unknown, a later batch may be refused with
//! `out_of_order_sequence` if the first never landed — start a new producer then.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use crate::idempotent::{encode_sequenced, next_sequence};
use crate::publish::{self, Message, Published};
use crate::{ClientError, StreamKey, stream_key};

use super::ClusterClient;

type ShardKey = (StreamKey, u32);

/// An idempotent producer on a cluster, from [`ClusterClient::idempotent_producer`]. Its
/// publishes are re-sent after any retryable failure, ambiguous ones included, until
/// `request_timeout`, and land at most once. Cheap to clone (clones share the producer id
/// and sequences).
///
/// ```no_run
/// # async fn demo(cluster: felix_client::ClusterClient) -> Result<(), felix_client::ClientError> {
/// use felix_client::Message;
/// let producer = cluster.idempotent_producer().await?;
/// // Survives a leader being killed mid-request without writing the record twice.
/// let p = producer.publish("acme", "prod", "orders", Message::new("paid").with_key("order-42")).await?;
/// println!("shard {} offset {}", p.shard, p.base_offset);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct IdempotentClusterProducer {
    inner: Arc<ProducerInner>,
}

struct ProducerInner {
    cluster: ClusterClient,
    producer_id: i64,
    epoch: i16,
    /// Next sequence per shard, each behind its own lock (held across a publish).
    sequences: Mutex<HashMap<ShardKey, Arc<tokio::sync::Mutex<i32>>>>,
    round_robin: AtomicU32,
}

impl std::fmt::Debug for IdempotentClusterProducer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdempotentClusterProducer")
            .field("producer_id", &self.inner.producer_id)
            .field("epoch", &self.inner.epoch)
            .finish()
    }
}

impl ClusterClient {
    /// Creates an idempotent producer with an id from any live broker (`producer_init`;
    /// the brokers must support [`crate::features::IDEMPOTENT_PRODUCER`]).
    pub async fn idempotent_producer(&self) -> Result<IdempotentClusterProducer, ClientError> {
        let (producer_id, epoch) = self.producer_init().await?;
        Ok(IdempotentClusterProducer {
            inner: Arc::new(ProducerInner {
                cluster: self.clone(),
                producer_id,
                epoch,
                sequences: Mutex::new(HashMap::new()),
                round_robin: AtomicU32::new(crate::round_robin_seed()),
            }),
        })
    }
}

impl IdempotentClusterProducer {
    /// The producer id and epoch.
    pub fn id(&self) -> (i64, i16) {
        (self.inner.producer_id, self.inner.epoch)
    }

    fn slot(&self, key: ShardKey) -> Arc<tokio::sync::Mutex<i32>> {
        let mut map = self
            .inner
            .sequences
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        map.entry(key).or_default().clone()
    }

    /// Publishes `messages` to `shard` as one sequenced batch, following the shard's leader
    /// and re-sending the same batch after any retryable failure until `request_timeout`.
    pub async fn publish_to_shard(
        &self,
        tenant: &str,
        namespace: &str,
        stream: &str,
        shard: u32,
        messages: &[Message],
    ) -> Result<Published, ClientError> {
        if messages.is_empty() {
            return Err(ClientError::InvalidArgument(
                "a batch needs at least one message".into(),
            ));
        }
        let key = stream_key(tenant, namespace, stream);
        let slot = self.slot((key.clone(), shard));
        let mut sequence = slot.lock().await;
        let batch = encode_sequenced(
            messages,
            self.inner.cluster.inner.config.compression,
            self.id(),
            *sequence,
        )?;
        match self
            .inner
            .cluster
            .send_to_shard(&key, shard, batch, true)
            .await
        {
            Ok(published) => {
                *sequence = next_sequence(*sequence, messages.len());
                Ok(published)
            }
            Err(failure) => {
                // A batch that certainly was not written gives its sequences back; one that
                // may have been keeps them, so a later batch is never taken for it.
                if failure.maybe_written {
                    *sequence = next_sequence(*sequence, messages.len());
                }
                Err(failure.error)
            }
        }
    }

    /// Publishes one message to its key's shard (a key-less one to the next shard in turn).
    pub async fn publish(
        &self,
        tenant: &str,
        namespace: &str,
        stream: &str,
        message: Message,
    ) -> Result<Published, ClientError> {
        let mut published = self
            .publish_batch(tenant, namespace, stream, vec![message])
            .await?;
        published
            .pop()
            .ok_or_else(|| ClientError::Protocol("no acknowledgement".into()))
    }

    /// Publishes messages placed as [`ClusterClient::publish_batch`] places them: one
    /// sequenced batch per shard, the shards concurrently. Returns one [`Published`] per
    /// shard, in shard order; fails if any shard failed (the others may have been written).
    pub async fn publish_batch(
        &self,
        tenant: &str,
        namespace: &str,
        stream: &str,
        messages: Vec<Message>,
    ) -> Result<Vec<Published>, ClientError> {
        if messages.is_empty() {
            return Ok(Vec::new());
        }
        let shards = self
            .inner
            .cluster
            .shard_count(tenant, namespace, stream)
            .await?;
        let keyless = self.inner.round_robin.fetch_add(1, Ordering::Relaxed) % shards.max(1);
        let plan = publish::place(&messages, shards, keyless);
        let mut tasks = tokio::task::JoinSet::new();
        for (shard, indices) in plan {
            let producer = self.clone();
            let (t, ns, s) = (tenant.to_owned(), namespace.to_owned(), stream.to_owned());
            let batch: Vec<Message> = indices.iter().map(|&i| messages[i].clone()).collect();
            tasks.spawn(async move { producer.publish_to_shard(&t, &ns, &s, shard, &batch).await });
        }
        let mut published = Vec::new();
        let mut first_error = None;
        while let Some(joined) = tasks.join_next().await {
            match joined {
                Ok(Ok(p)) => published.push(p),
                Ok(Err(e)) => {
                    first_error.get_or_insert(e);
                }
                Err(e) => {
                    first_error.get_or_insert(ClientError::Transport(format!(
                        "the publish task was lost: {e}"
                    )));
                }
            }
        }
        if let Some(e) = first_error {
            return Err(e);
        }
        published.sort_by_key(|p| p.shard);
        Ok(published)
    }
}
