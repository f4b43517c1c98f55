//! What a publish sends: messages, where each one goes, and the record batch per shard.
//!
//! Placement: a keyed message goes to `murmur2(key) % shards` (Kafka's default partitioner,
//! so a key lands on the same shard whichever client sent it); every key-less message of one
//! call goes to a single shard chosen round-robin per call, so key-less messages published
//! together stay together and in order. Within a shard, messages keep the order given and
//! travel in one RecordBatch.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use felix_wire::murmur2::shard_for_key;
use felix_wire::{BatchBuilder, Compression, Header, Record};

use crate::error::ClientError;

/// A message to publish: an optional key (which picks the shard), a payload, headers and an
/// optional timestamp (milliseconds since the Unix epoch; now when unset).
///
/// ```
/// use felix_client::Message;
/// let m = Message::new("hello").with_key("user-7").with_header("trace", "abc");
/// assert_eq!(&m.payload[..], b"hello");
/// assert_eq!(m.key.as_deref(), Some(&b"user-7"[..]));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Message {
    pub key: Option<Bytes>,
    pub payload: Bytes,
    pub headers: Vec<(String, Bytes)>,
    pub timestamp: Option<i64>,
}

impl Message {
    /// A message with a payload and nothing else.
    pub fn new(payload: impl Into<Bytes>) -> Message {
        Message {
            payload: payload.into(),
            ..Default::default()
        }
    }
    /// Sets the key: messages with the same key go to the same shard, in order.
    pub fn with_key(mut self, key: impl Into<Bytes>) -> Message {
        self.key = Some(key.into());
        self
    }
    /// Adds a header.
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<Bytes>) -> Message {
        self.headers.push((name.into(), value.into()));
        self
    }
    /// Sets the timestamp (milliseconds since the Unix epoch).
    pub fn with_timestamp(mut self, ms: i64) -> Message {
        self.timestamp = Some(ms);
        self
    }
}

/// A message of just a payload, so that `publish_batch(.., vec!["msg1", "msg2"], ..)` reads
/// as the spec writes it.
impl From<&'static str> for Message {
    fn from(payload: &'static str) -> Message {
        Message::new(payload)
    }
}

impl From<String> for Message {
    fn from(payload: String) -> Message {
        Message::new(payload)
    }
}

impl From<Bytes> for Message {
    fn from(payload: Bytes) -> Message {
        Message::new(payload)
    }
}

impl From<Vec<u8>> for Message {
    fn from(payload: Vec<u8>) -> Message {
        Message::new(payload)
    }
}

/// Where one shard's records landed: the offsets of its first and last record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Published {
    pub shard: u32,
    pub base_offset: u64,
    pub last_offset: u64,
}

impl Published {
    /// The offset of the `i`-th record of this shard's batch (records are numbered densely).
    pub fn offset_of(&self, i: usize) -> u64 {
        self.base_offset + i as u64
    }
}

/// The outcome of one shard's part of a `publish_batch_detailed` call.
#[derive(Debug)]
pub struct ShardOutcome {
    /// The shard the records were sent to.
    pub shard: u32,
    /// Positions, in the caller's `Vec<Message>`, of the records sent to this shard, in the
    /// order they were written (the `i`-th has offset `base_offset + i`).
    pub indices: Vec<usize>,
    /// `Ok(Some)` when acknowledged, `Ok(None)` for `AckMode::None`, or why it failed.
    pub result: Result<Option<Published>, ClientError>,
}

/// Groups message positions by shard (in shard order, positions in the order given).
/// Key-less messages all go to `keyless_shard`.
pub(crate) fn place(
    messages: &[Message],
    shards: u32,
    keyless_shard: u32,
) -> Vec<(u32, Vec<usize>)> {
    let mut by_shard: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
    for (i, m) in messages.iter().enumerate() {
        let shard = match &m.key {
            Some(key) => shard_for_key(key, shards),
            None => keyless_shard,
        };
        by_shard.entry(shard).or_default().push(i);
    }
    by_shard.into_iter().collect()
}

/// The acknowledgements of a publish, in shard order; the first shard's error if one failed.
pub(crate) fn acknowledged(outcomes: Vec<ShardOutcome>) -> Result<Vec<Published>, ClientError> {
    let mut published = Vec::with_capacity(outcomes.len());
    for outcome in outcomes {
        if let Some(p) = outcome.result? {
            published.push(p);
        }
    }
    Ok(published)
}

/// Sends each shard's part of `plan` with `send`, the shards concurrently (each in a task of
/// its own, so a publish dropped by its caller still finishes; `inline_one` sends a plan of
/// one shard without a task), and gives each shard's outcome in plan order.
pub(crate) async fn send_each<F, Fut>(
    plan: Vec<(u32, Vec<usize>)>,
    inline_one: bool,
    send: F,
) -> Vec<ShardOutcome>
where
    F: Fn(u32, Vec<usize>) -> Fut,
    Fut: Future<Output = Result<Option<Published>, ClientError>> + Send + 'static,
{
    if inline_one && let [(shard, indices)] = plan.as_slice() {
        // The common case (one key, or key-less): no task to spawn.
        let result = send(*shard, indices.clone()).await;
        return vec![ShardOutcome {
            shard: *shard,
            indices: indices.clone(),
            result,
        }];
    }
    let mut tasks = tokio::task::JoinSet::new();
    for (pos, (shard, indices)) in plan.iter().enumerate() {
        let sending = send(*shard, indices.clone());
        tasks.spawn(async move { (pos, sending.await) });
    }
    let mut results: Vec<Option<Result<Option<Published>, ClientError>>> =
        plan.iter().map(|_| None).collect();
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok((pos, result)) => results[pos] = Some(result),
            Err(e) => tracing::error!("publish task failed: {e}"),
        }
    }
    plan.into_iter()
        .zip(results)
        .map(|((shard, indices), result)| ShardOutcome {
            shard,
            indices,
            result: result
                .unwrap_or_else(|| Err(ClientError::Transport("the publish task was lost".into()))),
        })
        .collect()
}

/// Encodes all of `messages`, now, as the one batch of a shard (refusing an empty one);
/// with `producer` (id, epoch, base sequence) as an idempotent producer's batch.
pub(crate) fn encode_shard_batch(
    messages: &[Message],
    compression: Compression,
    producer: Option<(i64, i16, i32)>,
) -> Result<Bytes, ClientError> {
    if messages.is_empty() {
        return Err(ClientError::InvalidArgument(
            "a batch needs at least one message".into(),
        ));
    }
    let indices: Vec<usize> = (0..messages.len()).collect();
    encode_batch(messages, &indices, compression, now_ms(), producer)
}

/// Which shard gets which messages: [`place`], with the key-less ones of this call on the
/// next shard of `round_robin`'s turn.
pub(crate) fn place_in_turn(
    messages: &[Message],
    shards: u32,
    round_robin: &AtomicU32,
) -> Vec<(u32, Vec<usize>)> {
    let keyless = if messages.iter().any(|m| m.key.is_none()) {
        round_robin.fetch_add(1, Ordering::Relaxed) % shards.max(1)
    } else {
        0
    };
    place(messages, shards, keyless)
}

/// Milliseconds since the Unix epoch, now.
pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Encodes the messages at `indices` as one RecordBatch; with `producer` (id, epoch, base
/// sequence) as an idempotent producer's batch.
pub(crate) fn encode_batch(
    messages: &[Message],
    indices: &[usize],
    compression: Compression,
    now: i64,
    producer: Option<(i64, i16, i32)>,
) -> Result<Bytes, ClientError> {
    let mut builder = BatchBuilder::new(compression);
    if let Some((id, epoch, seq)) = producer {
        builder = builder.producer(id, epoch, seq);
    }
    for &i in indices {
        let m = &messages[i];
        builder.push(Record {
            offset: 0,
            timestamp: m.timestamp.unwrap_or(now),
            key: m.key.clone(),
            value: Some(m.payload.clone()),
            headers: m
                .headers
                .iter()
                .map(|(k, v)| Header {
                    key: k.clone(),
                    value: Some(v.clone()),
                })
                .collect(),
        });
    }
    builder
        .build()
        .map(Bytes::from)
        .map_err(|e| ClientError::InvalidArgument(format!("cannot encode the batch: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use felix_wire::DecodedBatch;
    use felix_wire::record::DEFAULT_MAX_DECOMPRESSED;

    #[test]
    fn keyed_messages_go_to_their_murmur2_shard_in_the_order_given() {
        let msgs: Vec<Message> = (0..50)
            .map(|i| Message::new(format!("p{i}")).with_key(format!("k{}", i % 7)))
            .collect();
        let plan = place(&msgs, 4, 0);
        let mut seen = Vec::new();
        for (shard, idx) in &plan {
            assert!(idx.windows(2).all(|w| w[0] < w[1]), "order kept");
            for &i in idx {
                let key = msgs[i].key.as_ref().unwrap();
                assert_eq!(shard_for_key(key, 4), *shard);
                seen.push(i);
            }
        }
        assert!(plan.windows(2).all(|w| w[0].0 < w[1].0), "shards in order");
        seen.sort();
        assert_eq!(seen, (0..50).collect::<Vec<_>>());
    }

    #[test]
    fn keyless_messages_of_one_call_share_a_shard() {
        let msgs = vec![
            Message::new("a"),
            Message::new("b").with_key("foobar"),
            Message::new("c"),
            Message::new("d"),
        ];
        let keyed_shard = shard_for_key(b"foobar", 8);
        let keyless = (keyed_shard + 1) % 8;
        let plan = place(&msgs, 8, keyless);
        let get = |s| plan.iter().find(|(x, _)| *x == s).map(|(_, v)| v.clone());
        assert_eq!(get(keyless), Some(vec![0, 2, 3]));
        assert_eq!(get(keyed_shard), Some(vec![1]));
        assert_eq!(plan.len(), 2);
    }

    #[test]
    fn one_shard_takes_everything_and_kafka_reference_keys_place_as_kafka_does() {
        let msgs = vec![Message::new("x").with_key("21"), Message::new("y")];
        assert_eq!(place(&msgs, 1, 0), vec![(0, vec![0, 1])]);
        // murmur2("21") = -973932308: positive part 1173551340 % 10 = 0.
        assert_eq!(shard_for_key(b"21", 10), 1_173_551_340 % 10);
    }

    #[test]
    fn a_shard_batch_round_trips_keys_headers_timestamps_and_codec() {
        let msgs = vec![
            Message::new("one").with_key("k").with_header("h", "v"),
            Message::new("two").with_timestamp(5),
            Message::new(""),
        ];
        for codec in [
            Compression::None,
            Compression::Gzip,
            Compression::Snappy,
            Compression::Lz4,
            Compression::Zstd,
        ] {
            let bytes = encode_batch(&msgs, &[0, 1, 2], codec, 1000, None).unwrap();
            let batch = DecodedBatch::decode(&bytes, DEFAULT_MAX_DECOMPRESSED).unwrap();
            assert_eq!(batch.header.compression().unwrap(), codec);
            let r = &batch.records;
            assert_eq!(r.len(), 3);
            assert_eq!(r[0].key.as_deref(), Some(&b"k"[..]));
            assert_eq!(r[0].headers[0].key, "h");
            assert_eq!(r[0].timestamp, 1000);
            assert_eq!(r[1].timestamp, 5);
            assert_eq!(r[1].value.as_deref(), Some(&b"two"[..]));
            assert_eq!(r[2].offset, 2);
        }
    }
}
