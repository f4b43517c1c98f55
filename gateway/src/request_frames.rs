//! Request frames read off a client's request stream, one after another.
//!
//! A stream carries one request, or, on a connection that agreed to
//! `features::REUSED_STREAMS`, a cache operation after another (docs/protocol.md): the
//! broker answers each before it reads the next, so a client that sends several frames
//! without waiting gets their answers in the order it sent them. Whatever arrived past a
//! frame is therefore kept for the next one, never dropped.
//!
//! Invariant: a frame is handed on only whole; a stream that ends or is reset inside one
//! yields nothing, so a request cut off mid-frame is never acted on.

use std::collections::VecDeque;

use bytes::Bytes;
use felix_wire::protocol::{Frame, FrameError};

/// Why no frame came.
pub(crate) enum ReadError {
    /// The stream ended cleanly where a frame would have begun: the client is done with it.
    Ended,
    /// The peer went away, reset the stream or ended it inside a frame: nothing to answer.
    Gone,
    /// The frame's length is over the limit: it was not read, so the stream's framing is
    /// lost and nothing more can be read from it.
    TooLarge(FrameError),
    /// The frame was read whole but is not a valid frame: the next one starts right after
    /// it, so the stream may carry on.
    Malformed(FrameError),
}

/// The frames of one request stream.
pub(crate) struct FrameReader {
    recv: quinn::RecvStream,
    /// Bytes read from the stream and not yet consumed, in order.
    pending: VecDeque<Bytes>,
}

impl FrameReader {
    pub(crate) fn new(recv: quinn::RecvStream) -> FrameReader {
        FrameReader {
            recv,
            pending: VecDeque::new(),
        }
    }

    /// Stops the stream's receiving side: nothing more is read from it.
    pub(crate) fn stop(&mut self) {
        let _ = self.recv.stop(0u32.into());
    }

    /// The next whole frame, of at most `max` bytes after its length field.
    pub(crate) async fn next(&mut self, max: usize) -> Result<Frame, ReadError> {
        let mut len = [0u8; 4];
        let mut have = 0;
        while have < 4 {
            match self.chunk(4 - have).await? {
                Some(c) => {
                    len[have..have + c.len()].copy_from_slice(&c);
                    have += c.len();
                }
                None if have == 0 => return Err(ReadError::Ended),
                None => return Err(ReadError::Gone),
            }
        }
        let n = u32::from_be_bytes(len) as usize;
        if n > max {
            return Err(ReadError::TooLarge(FrameError::TooLarge { len: n, max }));
        }
        // Chunks are appended as they arrive (no zeroed buffer to overwrite), and the
        // frame's body is a slice of this buffer (no second copy of a publish's batches).
        let mut buf = Vec::with_capacity(4 + n);
        buf.extend_from_slice(&len);
        while buf.len() < 4 + n {
            let c = self
                .chunk(4 + n - buf.len())
                .await?
                .ok_or(ReadError::Gone)?;
            buf.extend_from_slice(&c);
        }
        Frame::decode_shared(&Bytes::from(buf), max)
            .map(|(f, _)| f)
            .map_err(ReadError::Malformed)
    }

    /// At most `want` bytes (at least one), the next ones of the stream; `None` at its
    /// clean end.
    async fn chunk(&mut self, want: usize) -> Result<Option<Bytes>, ReadError> {
        loop {
            if let Some(mut c) = self.pending.pop_front() {
                if c.is_empty() {
                    continue;
                }
                if c.len() > want {
                    self.pending.push_front(c.split_off(want));
                }
                return Ok(Some(c));
            }
            // Many chunks per call: each call takes the connection's lock, which its driver
            // holds while it decrypts, so taking it once per chunk (one packet's payload)
            // contends at every packet.
            let mut chunks: [Bytes; 32] = Default::default();
            match self.recv.read_chunks(&mut chunks).await {
                Ok(Some(count)) => self.pending.extend(chunks.into_iter().take(count)),
                Ok(None) => return Ok(None),
                Err(_) => return Err(ReadError::Gone),
            }
        }
    }
}
