//! A subscription to one shard: the QUIC stream the broker writes `Event` frames to, decoded
//! into records one at a time.
//!
//! Invariant: records come out in log order, never below the subscription's start offset
//! (a stored batch can begin before it), control batches are never surfaced, and every
//! record of a frame is handed out before the next frame is read — so an `End` frame is
//! reported only after everything delivered before it.

use std::collections::VecDeque;

use bytes::{Bytes, BytesMut};
use felix_wire::protocol::{ErrorBody, Event as WireEvent, Frame, FrameKind, Response, codes};
use felix_wire::record::DEFAULT_MAX_DECOMPRESSED;
use felix_wire::{BatchIter, DecodedBatch};

use crate::error::{ClientError, read_error};

/// A record delivered by a subscription.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// Its offset in the shard's log.
    pub offset: u64,
    /// Milliseconds since the Unix epoch.
    pub timestamp: i64,
    pub key: Option<Bytes>,
    /// The payload (empty for a record with a null value).
    pub payload: Bytes,
    /// Headers; a null header value reads as empty.
    pub headers: Vec<(String, Bytes)>,
}

/// A live subscription to one shard on one broker, from [`crate::Connection::subscribe`] (a
/// [`crate::ClusterSubscription`] reads through one at a time). Dropping it ends the subscription.
///
/// ```no_run
/// # async fn demo(client: felix_client::Connection) -> Result<(), felix_client::ClientError> {
/// use felix_client::{ClientError, StartAt};
/// let mut sub = client.subscribe("acme", "prod", "orders", 0, StartAt::Earliest).await?;
/// loop {
///     match sub.next_event().await {
///         Ok(Some(event)) => println!("{}: {:?}", event.offset, event.payload),
///         Ok(None) => break, // the broker ended the subscription cleanly
///         Err(ClientError::SubscriptionLagged { resume_offset }) => {
///             sub = client
///                 .subscribe("acme", "prod", "orders", 0, StartAt::Offset(resume_offset))
///                 .await?;
///         }
///         Err(e) => return Err(e),
///     }
/// }
/// # Ok(()) }
/// ```
pub struct Subscription {
    shard: u32,
    start_offset: u64,
    live_offset: u64,
    /// One past the last record handed out (or the start offset): where to resume.
    next_offset: u64,
    recv: quinn::RecvStream,
    max_frame: usize,
    /// Bytes read but not yet a whole frame: kept here, not in a future, so cancelling
    /// `next_event` loses nothing.
    buf: BytesMut,
    pending: VecDeque<Event>,
    done: bool,
}

impl std::fmt::Debug for Subscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscription")
            .field("shard", &self.shard)
            .field("start_offset", &self.start_offset)
            .field("live_offset", &self.live_offset)
            .field("next_offset", &self.next_offset)
            .field("done", &self.done)
            .finish()
    }
}

impl Subscription {
    pub(crate) fn new(
        shard: u32,
        start_offset: u64,
        live_offset: u64,
        recv: quinn::RecvStream,
        max_frame: usize,
    ) -> Subscription {
        Subscription {
            shard,
            start_offset,
            live_offset,
            next_offset: start_offset,
            recv,
            max_frame,
            buf: BytesMut::new(),
            pending: VecDeque::new(),
            done: false,
        }
    }

    /// The next whole frame; `None` when the stream ended cleanly between frames.
    /// Cancel-safe: partial frames stay in `self.buf`.
    async fn next_frame(&mut self) -> Result<Option<Frame>, ClientError> {
        loop {
            if self.buf.len() >= 4 {
                let total = Frame::peek_len(&self.buf, self.max_frame)
                    .map_err(|e| ClientError::Protocol(e.to_string()))?;
                if self.buf.len() >= total {
                    // Frozen, the frame's bytes are shared by its body and the records
                    // decoded from it: no copy after the one into `buf`.
                    let bytes = self.buf.split_to(total).freeze();
                    let (frame, _) = Frame::decode_shared(&bytes, self.max_frame)
                        .map_err(|e| ClientError::Protocol(e.to_string()))?;
                    return Ok(Some(frame));
                }
                self.buf.reserve(total - self.buf.len());
            }
            // Many chunks per call: each call takes the connection's lock, which the
            // connection driver holds while it decrypts, so one take per chunk (one
            // packet's payload) contends with it at every packet.
            let mut chunks: [Bytes; 32] = Default::default();
            match self.recv.read_chunks(&mut chunks).await {
                Ok(Some(n)) => {
                    for chunk in &chunks[..n] {
                        self.buf.extend_from_slice(chunk);
                    }
                }
                Ok(None) if self.buf.is_empty() => return Ok(None),
                Ok(None) => {
                    return Err(ClientError::Protocol(format!(
                        "subscription stream ended inside a frame ({} bytes)",
                        self.buf.len()
                    )));
                }
                Err(e) => return Err(read_error(e)),
            }
        }
    }

    /// The shard this subscription reads.
    pub fn shard(&self) -> u32 {
        self.shard
    }
    /// Where delivery begins (the first offset at or after the requested position).
    pub fn start_offset(&self) -> u64 {
        self.start_offset
    }
    /// The log's end when the subscription opened: records below it are catch-up, records
    /// from it on are live.
    pub fn live_offset(&self) -> u64 {
        self.live_offset
    }
    /// One past the last record returned so far (the start offset before any): the offset to
    /// resume from after a disconnect.
    pub fn next_offset(&self) -> u64 {
        self.next_offset
    }
    /// Records already received and not yet returned by [`Subscription::next_event`]: the
    /// rest of the frame last read. The broker sizes a replay's frames by the connection's
    /// share of `subscriber_egress_max_bytes`, so this shows how much one frame carried.
    pub fn buffered(&self) -> usize {
        self.pending.len()
    }

    /// The next record. `Ok(None)` when the broker ended the subscription cleanly;
    /// [`ClientError::SubscriptionLagged`] when it ended it because this subscriber fell
    /// behind (resubscribe from `resume_offset`); [`ClientError::Broker`] when it ended for
    /// another reason (shard moved, broker stopping, ...). Waits as long as it takes for a
    /// record: there is no request timeout here (a lost connection still ends it, with
    /// [`ClientError::Transport`]).
    ///
    /// Cancel-safe: it can be raced in `tokio::select!` or under a timeout; a cancelled call
    /// loses nothing (a partly received frame waits for the next call).
    pub async fn next_event(&mut self) -> Result<Option<Event>, ClientError> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                self.next_offset = event.offset + 1;
                return Ok(Some(event));
            }
            if self.done {
                return Ok(None);
            }
            let frame = match self.next_frame().await {
                Ok(Some(frame)) => frame,
                Ok(None) => {
                    self.done = true;
                    return Ok(None);
                }
                Err(e) => {
                    self.done = true;
                    return Err(e);
                }
            };
            match frame.kind {
                FrameKind::Event => {}
                FrameKind::Response => {
                    self.done = true;
                    return Err(match frame.header::<Response>() {
                        Ok(Response::Error(body)) => ClientError::Broker(body),
                        Ok(other) => ClientError::Protocol(format!(
                            "unexpected response on a subscription: {other:?}"
                        )),
                        Err(e) => ClientError::Protocol(e.to_string()),
                    });
                }
                FrameKind::Request => {
                    self.done = true;
                    return Err(ClientError::Protocol(
                        "request frame on a subscription".into(),
                    ));
                }
            }
            let header = frame.header::<WireEvent>().map_err(|e| {
                self.done = true;
                ClientError::Protocol(e.to_string())
            })?;
            match header {
                WireEvent::Records { .. } => {
                    // Only the start offset filters: the broker numbers and orders records,
                    // and a stream's offsets are its own business past that point.
                    if let Err(e) =
                        decode_records(&frame.body, self.start_offset, &mut self.pending)
                    {
                        self.done = true;
                        return Err(e);
                    }
                }
                WireEvent::End(body) => {
                    self.done = true;
                    return Err(end_error(body, self.next_offset));
                }
                WireEvent::CacheChange(_) => {
                    self.done = true;
                    return Err(ClientError::Protocol(
                        "a cache change on a subscription".into(),
                    ));
                }
            }
        }
    }
}

/// The error an `End` frame becomes.
fn end_error(body: ErrorBody, next_offset: u64) -> ClientError {
    if body.code == codes::SUBSCRIPTION_LAGGED {
        ClientError::SubscriptionLagged {
            resume_offset: body.resume_offset.unwrap_or(next_offset),
        }
    } else {
        ClientError::Broker(body)
    }
}

/// Decodes every data batch in `body` (any codec), appending its records at or above
/// `min_offset` to `out`.
pub(crate) fn decode_records(
    body: &Bytes,
    min_offset: u64,
    out: &mut VecDeque<Event>,
) -> Result<(), ClientError> {
    for item in BatchIter::new(body, usize::MAX) {
        let (header, bytes) = item.map_err(|(pos, e)| {
            ClientError::Protocol(format!("bad record batch at byte {pos} of an event: {e}"))
        })?;
        if header.is_control() || header.last_offset() < min_offset as i64 {
            continue;
        }
        // The iterator has checked the batch's CRC: decode it without checking again.
        let batch = DecodedBatch::decode_shared_validated(
            &body.slice_ref(bytes),
            header,
            DEFAULT_MAX_DECOMPRESSED,
        )
        .map_err(|e| ClientError::Protocol(format!("bad record batch in an event: {e}")))?;
        for r in batch.records {
            let Ok(offset) = u64::try_from(r.offset) else {
                continue;
            };
            if offset < min_offset {
                continue;
            }
            out.push_back(Event {
                offset,
                timestamp: r.timestamp,
                key: r.key,
                payload: r.value.unwrap_or_default(),
                headers: r
                    .headers
                    .into_iter()
                    .map(|h| (h.key, h.value.unwrap_or_default()))
                    .collect(),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use felix_wire::batch::stamp_base_offset;
    use felix_wire::{BatchBuilder, Compression, Record};

    fn batch(base: i64, values: &[&str], codec: Compression, control: bool) -> Vec<u8> {
        let mut b = BatchBuilder::new(codec).control(control);
        for (i, v) in values.iter().enumerate() {
            b.push(Record::value(100 + i as i64, v.to_string()));
        }
        let mut bytes = b.build().unwrap();
        stamp_base_offset(&mut bytes, base);
        bytes
    }

    #[test]
    fn records_below_the_start_and_control_batches_are_skipped() {
        let mut body = batch(10, &["a", "b", "c"], Compression::Lz4, false);
        body.extend(batch(13, &["marker"], Compression::None, true));
        body.extend(batch(14, &["d", "e"], Compression::Zstd, false));
        let mut out = VecDeque::new();
        decode_records(&Bytes::from(body), 12, &mut out).unwrap();
        let got: Vec<(u64, &[u8])> = out.iter().map(|e| (e.offset, &e.payload[..])).collect();
        assert_eq!(got, vec![(12, &b"c"[..]), (14, &b"d"[..]), (15, &b"e"[..])]);
        assert_eq!(out[0].timestamp, 102);
    }

    #[test]
    fn every_codec_decodes() {
        for codec in [
            Compression::None,
            Compression::Gzip,
            Compression::Snappy,
            Compression::Lz4,
            Compression::Zstd,
        ] {
            let mut out = VecDeque::new();
            let body = Bytes::from(batch(0, &["x", "y"], codec, false));
            decode_records(&body, 0, &mut out).unwrap();
            assert_eq!(out.len(), 2, "{codec:?}");
        }
    }

    #[test]
    fn a_corrupt_batch_is_a_protocol_error() {
        let mut body = batch(0, &["x"], Compression::None, false);
        let last = body.len() - 1;
        body[last] ^= 0xff;
        let mut out = VecDeque::new();
        assert!(matches!(
            decode_records(&Bytes::from(body), 0, &mut out),
            Err(ClientError::Protocol(_))
        ));
    }

    #[test]
    fn lagged_end_carries_the_resume_offset() {
        let mut body = ErrorBody::new(codes::SUBSCRIPTION_LAGGED, "subscription_lagged", "slow");
        body.resume_offset = Some(77);
        assert!(matches!(
            end_error(body.clone(), 5),
            ClientError::SubscriptionLagged { resume_offset: 77 }
        ));
        body.resume_offset = None;
        assert!(matches!(
            end_error(body, 5),
            ClientError::SubscriptionLagged { resume_offset: 5 }
        ));
        let other = ErrorBody::new(codes::SHARD_UNAVAILABLE, "shard_unavailable", "moved");
        assert!(matches!(end_error(other, 5), ClientError::Broker(_)));
    }
}
