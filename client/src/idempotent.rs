//! Idempotent producers: a producer id from the broker and a sequence per shard, carried in
//! each RecordBatch's header (producer id, epoch, base sequence), so that a batch re-sent
//! after a lost acknowledgement lands once — the shard's leader answers a sequence it
//! already holds with the offsets it gave it, even after a restart (the sequences are in
//! the log).

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use felix_wire::Compression;
use felix_wire::protocol::AckMode;
use tokio::sync::Mutex;

use crate::publish::{Message, Published, encode_batch, now_ms};
use crate::{Client, ClientError};

/// How often a publish whose outcome is unknown is re-sent before giving up.
const RESENDS: usize = 3;

/// Encodes `messages` as one batch of `producer` (id, epoch) whose first record has
/// sequence `sequence`. A shard's sequences start at 0 and a batch of `n` records takes
/// `n` of them ([`next_sequence`]).
pub(crate) fn encode_sequenced(
    messages: &[Message],
    compression: Compression,
    producer: (i64, i16),
    sequence: i32,
) -> Result<Bytes, ClientError> {
    let indices: Vec<usize> = (0..messages.len()).collect();
    encode_batch(
        messages,
        &indices,
        compression,
        now_ms(),
        Some((producer.0, producer.1, sequence)),
    )
}

/// The sequence after a batch of `records` that began at `sequence` (wrapping, as Kafka's).
pub(crate) fn next_sequence(sequence: i32, records: usize) -> i32 {
    sequence.wrapping_add(records as i32)
}

/// A producer whose publishes land at most once per sequence. Publishes to one shard
/// through one producer are serialized (each batch takes the next sequence).
pub struct IdempotentProducer {
    client: Mutex<Client>,
    producer_id: i64,
    epoch: i16,
    /// Next sequence per (tenant, namespace, stream, shard).
    sequences: Mutex<HashMap<(String, String, String, u32), i32>>,
}

impl Client {
    /// Creates an idempotent producer with an id from the broker (`producer_init`).
    pub async fn idempotent_producer(&self) -> Result<IdempotentProducer, ClientError> {
        let (producer_id, epoch) = self.producer_init().await?;
        Ok(IdempotentProducer {
            client: Mutex::new(self.clone()),
            producer_id,
            epoch,
            sequences: Mutex::new(HashMap::new()),
        })
    }
}

impl IdempotentProducer {
    /// The producer id and epoch.
    pub fn id(&self) -> (i64, i16) {
        (self.producer_id, self.epoch)
    }

    /// Uses another connection from now on (after reconnecting to the broker); sequences
    /// continue, so re-sends are still recognised.
    pub async fn set_client(&self, client: Client) {
        *self.client.lock().await = client;
    }

    /// Encodes `messages` as one sequenced batch for `shard`, taking the next sequence.
    /// The bytes can be re-sent as often as needed with [`Client::publish_raw`].
    pub async fn encode(
        &self,
        tenant: &str,
        namespace: &str,
        stream: &str,
        shard: u32,
        messages: &[Message],
    ) -> Result<Bytes, ClientError> {
        if messages.is_empty() {
            return Err(ClientError::InvalidArgument(
                "a batch needs at least one message".into(),
            ));
        }
        let key = (
            tenant.to_owned(),
            namespace.to_owned(),
            stream.to_owned(),
            shard,
        );
        let mut seqs = self.sequences.lock().await;
        let seq = seqs.entry(key).or_insert(0);
        let compression = self.client.lock().await.compression();
        let bytes = encode_sequenced(messages, compression, self.id(), *seq)?;
        *seq = next_sequence(*seq, messages.len());
        Ok(bytes)
    }

    /// Publishes `messages` to `shard` as one sequenced batch and waits for the
    /// acknowledgement. If the outcome is unknown (connection lost, timeout), the same
    /// bytes are re-sent up to 3 times; the broker lands them once.
    pub async fn publish_to_shard(
        &self,
        tenant: &str,
        namespace: &str,
        stream: &str,
        shard: u32,
        messages: &[Message],
    ) -> Result<Published, ClientError> {
        let batch = self
            .encode(tenant, namespace, stream, shard, messages)
            .await?;
        let mut attempt = 0;
        loop {
            let client = self.client.lock().await.clone();
            match client
                .publish_raw(
                    tenant,
                    namespace,
                    stream,
                    shard,
                    batch.clone(),
                    AckMode::Batch,
                )
                .await
            {
                Ok(Some(p)) => return Ok(p),
                Ok(None) => {
                    return Err(ClientError::Protocol(
                        "the broker did not acknowledge".into(),
                    ));
                }
                Err(e) if e.outcome_unknown() && attempt < RESENDS => {
                    attempt += 1;
                    tokio::time::sleep(Duration::from_millis(100 * attempt as u64)).await;
                }
                Err(e) => return Err(e),
            }
        }
    }
}
