//! Reused request streams (`features::REUSED_STREAMS`, docs/protocol.md): a cache request
//! goes out on a stream an earlier one left open, when one is idle, instead of on a stream
//! of its own. The broker keeps a cache operation's stream open after its answer and reads
//! the next frame from it, so a busy client stops paying a stream's opening and closing
//! (its bookkeeping at both ends, the broker's task per stream) on every operation.
//!
//! Invariant: a stream is idle (may carry the next request) only once its answer was read
//! whole and that answer is one after which the broker keeps reading: any answer to a
//! cache request except a frame-level refusal (`frame_too_large`, `malformed_*`), after
//! which the broker may end the stream. A request whose reused stream refuses the write
//! (the broker stopped reading it) was not read, and goes out again on a new stream;
//! once its frame was handed to QUIC, a failure is an unknown outcome as on any stream.

use std::time::Duration;

use bytes::Bytes;
use felix_wire::protocol::{Request, Response, codes};

use crate::error::{ClientError, connection_error, write_error};
use crate::request::{Failed, encode_request_as, parse_response, read_frame, settle};

/// At most this many streams wait idle per connection: as many as requests ran at once,
/// up to this. The broker allows 4,096 open streams per connection; idle ones count.
const MAX_IDLE: usize = 64;

/// A connection's idle request streams.
#[derive(Default)]
pub(crate) struct IdleStreams {
    streams: std::sync::Mutex<Vec<(quinn::SendStream, quinn::RecvStream)>>,
}

impl IdleStreams {
    fn take(&self) -> Option<(quinn::SendStream, quinn::RecvStream)> {
        self.streams.lock().unwrap_or_else(|e| e.into_inner()).pop()
    }

    /// Keeps `stream` for a later request, or ends it (dropping a send side finishes it)
    /// when enough are idle.
    fn give_back(&self, stream: (quinn::SendStream, quinn::RecvStream)) {
        let mut streams = self.streams.lock().unwrap_or_else(|e| e.into_inner());
        if streams.len() < MAX_IDLE {
            streams.push(stream);
        }
    }
}

/// Sends a cache `request` with `body` on an idle stream of `conn` (a new one when none
/// is idle) and reads its answer and the answer's body, all within `timeout`; the stream
/// is idle again afterwards. Only on a connection that agreed to `REUSED_STREAMS`; with
/// `binary` (it agreed to `BINARY_CACHE_HEADERS` too) a key operation's header is binary.
pub(crate) async fn call_reusing(
    conn: &quinn::Connection,
    idle: &IdleStreams,
    request: &Request,
    body: Bytes,
    max_frame: usize,
    timeout: Duration,
    binary: bool,
) -> Result<(Response, Bytes), Failed> {
    let frame = encode_request_as(request, body, max_frame, binary)
        .map_err(|error| Failed { error, sent: false })?;
    let mut sent = false;
    let result = tokio::time::timeout(timeout, async {
        let (mut send, mut recv) = loop {
            let (reused, (mut send, recv)) = match idle.take() {
                Some(stream) => (true, stream),
                None => (false, conn.open_bi().await.map_err(connection_error)?),
            };
            let mut chunks = frame.clone();
            match send.write_all_chunks(&mut chunks).await {
                Ok(()) => break (send, recv),
                // The broker stopped reading this idle stream: nothing of the request was
                // read. A new stream takes it.
                Err(quinn::WriteError::Stopped(_) | quinn::WriteError::ClosedStream) if reused => {}
                // A new stream the broker refused before reading it all (its answer, e.g.
                // `frame_too_large`, is on `recv`).
                Err(quinn::WriteError::Stopped(_)) => break (send, recv),
                Err(e) => return Err(write_error(e)),
            }
        };
        sent = true;
        let frame = read_frame(&mut recv, max_frame).await?.ok_or_else(|| {
            ClientError::Protocol("the broker closed the request stream without answering".into())
        })?;
        let response = parse_response(&frame);
        // After a frame-level refusal the broker may end the stream.
        let keep = match &response {
            Ok(_) => true,
            Err(ClientError::Broker(e)) => {
                e.code != codes::FRAME_TOO_LARGE && !e.reason.starts_with("malformed")
            }
            Err(_) => false,
        };
        if keep {
            idle.give_back((send, recv));
        } else {
            // Ending our side: the broker ends the stream at its end.
            let _ = send.finish();
        }
        Ok((response?, frame.body))
    })
    .await;
    settle(result, sent)
}
