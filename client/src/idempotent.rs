//! Idempotent producers: a producer id from the broker and a sequence per shard, carried in
//! each RecordBatch's header (producer id, epoch, base sequence), so that a batch re-sent
//! after a lost acknowledgement lands once: the shard's leader answers a sequence it already
//! holds with the offsets it gave it, even after a failover or a restart (the sequences are
//! in the log). From a [`Client`] a batch whose outcome is unknown (the leader killed
//! mid-request, `quorum_timeout`) is re-sent to whichever broker leads the shard by then;
//! from a [`Connection`], to that one broker.
//!
//! Invariant: one batch per shard is in flight at a time (a shard's sequence slot is held
//! from encoding to the final answer), so a shard's batches land in sequence order. A
//! shard's sequence advances past a batch unless the batch certainly was not written (a
//! batch handed out by [`IdempotentProducer::encode`] counts as written: its fate is the
//! caller's). After a batch whose outcome stayed unknown, a later batch may be refused with
//! `out_of_order_sequence` if the first never landed: start a new producer then.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use felix_wire::Compression;
use felix_wire::protocol::AckMode;

use crate::cluster::{PublishFailure, may_be_written};
use crate::publish::{self, Message, Published};
use crate::{Client, ClientError, Connection, StreamKey, round_robin_seed, stream_key};

/// How often a pinned producer re-sends a publish whose outcome is unknown before giving up
/// (a routed one re-sends until `request_timeout`).
const PINNED_RESENDS: usize = 3;

type ShardKey = (StreamKey, u32);

/// The spec's name for the idempotent producer of a cluster client: the same type.
pub type IdempotentClusterProducer = IdempotentProducer;

/// A producer whose publishes land at most once per sequence, from
/// [`Client::idempotent_producer`] (or [`Connection::idempotent_producer`], pinned to one
/// broker). Its publishes are re-sent after any retryable failure, ambiguous ones
/// included. Cheap to clone (clones share the producer id and sequences).
///
/// ```no_run
/// # async fn demo(client: felix_client::Client) -> Result<(), felix_client::ClientError> {
/// use felix_client::Message;
/// let producer = client.idempotent_producer().await?;
/// // Survives a leader being killed mid-request without writing the record twice.
/// let p = producer.publish("acme", "prod", "orders", Message::new("paid").with_key("order-42")).await?;
/// println!("shard {} offset {}", p.shard, p.base_offset);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct IdempotentProducer {
    inner: Arc<ProducerInner>,
}

/// Where a producer's batches go.
enum Target {
    /// To each shard's leader, following it.
    Routed(Client),
    /// To one broker.
    Pinned(Connection),
}

struct ProducerInner {
    target: Target,
    producer_id: i64,
    epoch: i16,
    /// Next sequence per shard, each behind its own lock (held across a publish).
    sequences: Mutex<HashMap<ShardKey, Arc<tokio::sync::Mutex<i32>>>>,
    round_robin: AtomicU32,
}

impl std::fmt::Debug for IdempotentProducer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdempotentProducer")
            .field("producer_id", &self.inner.producer_id)
            .field("epoch", &self.inner.epoch)
            .finish()
    }
}

impl Client {
    /// Creates an idempotent producer with an id from any live broker (`producer_init`;
    /// the brokers must support [`crate::FEATURE_IDEMPOTENT_PRODUCER`]).
    pub async fn idempotent_producer(&self) -> Result<IdempotentProducer, ClientError> {
        let id = self.producer_init().await?;
        Ok(IdempotentProducer::new(Target::Routed(self.clone()), id))
    }
}

impl Connection {
    /// Creates an idempotent producer whose batches go to this broker only.
    pub async fn idempotent_producer(&self) -> Result<IdempotentProducer, ClientError> {
        let id = self.producer_init().await?;
        Ok(IdempotentProducer::new(Target::Pinned(self.clone()), id))
    }
}

/// The sequence after a batch of `records` that began at `sequence` (wrapping, as Kafka's).
fn next_sequence(sequence: i32, records: usize) -> i32 {
    sequence.wrapping_add(records as i32)
}

impl IdempotentProducer {
    fn new(target: Target, (producer_id, epoch): (i64, i16)) -> IdempotentProducer {
        IdempotentProducer {
            inner: Arc::new(ProducerInner {
                target,
                producer_id,
                epoch,
                sequences: Mutex::new(HashMap::new()),
                round_robin: AtomicU32::new(round_robin_seed()),
            }),
        }
    }

    /// The producer id and epoch.
    pub fn id(&self) -> (i64, i16) {
        (self.inner.producer_id, self.inner.epoch)
    }

    fn compression(&self) -> Compression {
        match &self.inner.target {
            Target::Routed(client) => client.config().compression,
            Target::Pinned(conn) => conn.compression(),
        }
    }

    fn slot(&self, key: ShardKey) -> Arc<tokio::sync::Mutex<i32>> {
        let mut map = self
            .inner
            .sequences
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        map.entry(key).or_default().clone()
    }

    /// `messages` as one batch of this producer whose first record has `sequence`.
    fn encode_at(&self, messages: &[Message], sequence: i32) -> Result<Bytes, ClientError> {
        let (id, epoch) = self.id();
        publish::encode_shard_batch(messages, self.compression(), Some((id, epoch, sequence)))
    }

    /// Encodes `messages` as one sequenced batch for `shard`, taking the next sequence.
    /// The bytes can be re-sent as often as needed with [`Connection::publish_raw`].
    pub async fn encode(
        &self,
        tenant: &str,
        namespace: &str,
        stream: &str,
        shard: u32,
        messages: &[Message],
    ) -> Result<Bytes, ClientError> {
        let slot = self.slot((stream_key(tenant, namespace, stream), shard));
        let mut sequence = slot.lock().await;
        let bytes = self.encode_at(messages, *sequence)?;
        *sequence = next_sequence(*sequence, messages.len());
        Ok(bytes)
    }

    /// Publishes `messages` to `shard` as one sequenced batch and waits for the
    /// acknowledgement, re-sending the same batch after a retryable failure, ambiguous
    /// ones included: a routed producer to the shard's leader until `request_timeout`, a
    /// pinned one to its broker up to 3 times.
    pub async fn publish_to_shard(
        &self,
        tenant: &str,
        namespace: &str,
        stream: &str,
        shard: u32,
        messages: &[Message],
    ) -> Result<Published, ClientError> {
        let key = stream_key(tenant, namespace, stream);
        let slot = self.slot((key.clone(), shard));
        let mut sequence = slot.lock().await;
        let batch = self.encode_at(messages, *sequence)?;
        let sent = match &self.inner.target {
            Target::Routed(client) => client
                .send_to_shard(&key, shard, batch, AckMode::Batch, true)
                .await
                .and_then(|p| {
                    p.ok_or_else(|| PublishFailure {
                        error: ClientError::Protocol("the broker did not acknowledge".into()),
                        maybe_written: true,
                    })
                }),
            Target::Pinned(conn) => send_pinned(conn, &key, shard, batch).await,
        };
        // A batch that certainly was not written gives its sequences back; one that may
        // have been keeps them, so a later batch is never taken for it.
        match sent {
            Ok(published) => {
                *sequence = next_sequence(*sequence, messages.len());
                Ok(published)
            }
            Err(failure) => {
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

    /// Publishes messages placed as [`Client::publish_batch`] places them: one sequenced
    /// batch per shard, the shards concurrently. Returns one [`Published`] per shard, in
    /// shard order; fails if any shard failed (the others may have been written).
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
        let shards = match &self.inner.target {
            Target::Routed(client) => client.shard_count(tenant, namespace, stream).await?,
            Target::Pinned(conn) => conn.shard_count(tenant, namespace, stream).await?,
        };
        let keyless = self.inner.round_robin.fetch_add(1, Ordering::Relaxed) % shards.max(1);
        let plan = publish::place(&messages, shards, keyless);
        let messages = Arc::new(messages);
        let outcomes = publish::send_each(plan, false, |shard, indices| {
            let producer = self.clone();
            let (t, ns, s) = (tenant.to_owned(), namespace.to_owned(), stream.to_owned());
            let batch: Vec<Message> = indices.iter().map(|&i| messages[i].clone()).collect();
            async move {
                let published = producer.publish_to_shard(&t, &ns, &s, shard, &batch);
                published.await.map(Some)
            }
        })
        .await;
        publish::acknowledged(outcomes)
    }
}

/// One batch to one broker, re-sent up to 3 times while its outcome is unknown.
async fn send_pinned(
    conn: &Connection,
    key: &StreamKey,
    shard: u32,
    batch: Bytes,
) -> Result<Published, PublishFailure> {
    let (t, ns, s) = key;
    let mut maybe_written = false;
    let mut attempt = 0;
    loop {
        let sent = conn.publish_raw_tracked(t, ns, s, shard, batch.clone(), AckMode::Batch);
        let failure = match sent.await {
            Ok(Some(p)) => return Ok(p),
            Ok(None) => {
                let error = ClientError::Protocol("the broker did not acknowledge".into());
                return Err(PublishFailure {
                    error,
                    maybe_written: true,
                });
            }
            Err(failure) => failure,
        };
        maybe_written |= may_be_written(&failure.error, failure.sent);
        if !failure.error.outcome_unknown() || attempt >= PINNED_RESENDS {
            return Err(PublishFailure {
                error: failure.error,
                maybe_written,
            });
        }
        attempt += 1;
        tokio::time::sleep(Duration::from_millis(100 * attempt as u64)).await;
    }
}
