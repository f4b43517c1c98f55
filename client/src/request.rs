//! One request, one bidirectional QUIC stream: write the request frame, finish the send
//! side, read frames back. Every exchange here is bounded by a timeout chosen by the caller;
//! reading a frame never buffers more than the frame limit.

use std::time::Duration;

use bytes::Bytes;
use felix_wire::protocol::{FRAME_PREFIX, Frame, FrameKind, Request, Response};

use crate::error::{ClientError, connection_error, read_error, write_error};

/// An opened request: its send side (already finished) and the stream to read answers from.
pub(crate) struct OpenRequest {
    pub send: quinn::SendStream,
    pub recv: quinn::RecvStream,
}

/// Encodes `request` with `body` as a request frame, refusing frames over `max_frame`.
/// Returns the head and the body as separate chunks, so the body is never copied.
pub(crate) fn encode_request(
    request: &Request,
    body: Bytes,
    max_frame: usize,
) -> Result<[Bytes; 2], ClientError> {
    encode_request_as(request, body, max_frame, false)
}

/// [`encode_request`], with a binary header for a cache key operation when `binary` (the
/// broker agreed to `features::BINARY_CACHE_HEADERS`).
pub(crate) fn encode_request_as(
    request: &Request,
    body: Bytes,
    max_frame: usize,
    binary: bool,
) -> Result<[Bytes; 2], ClientError> {
    encode_frame(
        felix_wire::binary::request_header(request, binary),
        body,
        max_frame,
    )
}

/// A request frame of `header` (already encoded) and `body`, refusing frames over
/// `max_frame`; the head and the body as separate chunks.
fn encode_frame(header: Vec<u8>, body: Bytes, max_frame: usize) -> Result<[Bytes; 2], ClientError> {
    let frame = Frame {
        kind: FrameKind::Request,
        header,
        body,
    };
    let len = frame.wire_len();
    if len > max_frame {
        return Err(ClientError::InvalidArgument(format!(
            "request of {len} bytes exceeds the frame limit of {max_frame} bytes; send fewer or smaller records"
        )));
    }
    Ok([Bytes::from(frame.encode_head()), frame.body])
}

/// Opens a stream and writes one encoded request frame to it, then finishes the send side.
///
/// If the broker stops the stream before taking the whole frame (it refused the request
/// early, e.g. `frame_too_large`), that is not an error here: its answer is on `recv`.
pub(crate) async fn open(
    conn: &quinn::Connection,
    frame: &[Bytes; 2],
) -> Result<OpenRequest, ClientError> {
    let (mut send, recv) = conn.open_bi().await.map_err(connection_error)?;
    let mut chunks = frame.clone();
    match send.write_all_chunks(&mut chunks).await {
        Ok(()) => {
            // Finishing can only fail if the stream was already reset or finished.
            let _ = send.finish();
        }
        // The broker refused the request before reading it all; its answer is on `recv`.
        Err(quinn::WriteError::Stopped(_)) => {}
        Err(e) => return Err(write_error(e)),
    }
    Ok(OpenRequest { send, recv })
}

/// Reads one frame; `Ok(None)` when the stream ended cleanly before a new frame began.
pub(crate) async fn read_frame(
    recv: &mut quinn::RecvStream,
    max_frame: usize,
) -> Result<Option<Frame>, ClientError> {
    let mut len_bytes = [0u8; 4];
    match recv.read_exact(&mut len_bytes).await {
        Ok(()) => {}
        Err(quinn::ReadExactError::FinishedEarly(0)) => return Ok(None),
        Err(quinn::ReadExactError::FinishedEarly(_)) => {
            return Err(ClientError::Protocol(
                "stream ended inside a frame's length".into(),
            ));
        }
        Err(quinn::ReadExactError::ReadError(e)) => return Err(read_error(e)),
    }
    let len = u32::from_be_bytes(len_bytes) as usize;
    if len > max_frame {
        return Err(ClientError::Protocol(format!(
            "frame of {len} bytes exceeds the limit of {max_frame}"
        )));
    }
    if len < FRAME_PREFIX - 4 {
        return Err(ClientError::Protocol(format!(
            "frame length {len} too small"
        )));
    }
    let mut buf = vec![0u8; 4 + len];
    buf[..4].copy_from_slice(&len_bytes);
    match recv.read_exact(&mut buf[4..]).await {
        Ok(()) => {}
        Err(quinn::ReadExactError::FinishedEarly(n)) => {
            return Err(ClientError::Protocol(format!(
                "stream ended inside a frame ({n} of {len} bytes)"
            )));
        }
        Err(quinn::ReadExactError::ReadError(e)) => return Err(read_error(e)),
    }
    // The body is a slice of the buffer read, not a second copy of it (a get's value).
    let (frame, _) = Frame::decode_shared(&Bytes::from(buf), max_frame)
        .map_err(|e| ClientError::Protocol(e.to_string()))?;
    Ok(Some(frame))
}

/// Reads the single response frame of a request and turns `Response::Error` into
/// [`ClientError::Broker`].
pub(crate) async fn read_response(
    recv: &mut quinn::RecvStream,
    max_frame: usize,
) -> Result<Response, ClientError> {
    let frame = read_frame(recv, max_frame).await?.ok_or_else(|| {
        ClientError::Protocol("the broker closed the request stream without answering".into())
    })?;
    parse_response(&frame)
}

pub(crate) fn parse_response(frame: &Frame) -> Result<Response, ClientError> {
    if frame.kind != FrameKind::Response {
        return Err(ClientError::Protocol(format!(
            "expected a response frame, got {:?}",
            frame.kind
        )));
    }
    // Binary for an answer to a binary cache or group request, else JSON.
    match felix_wire::binary::read_response(&frame.header)
        .map_err(|e| ClientError::Protocol(e.to_string()))?
    {
        Response::Error(body) => Err(ClientError::Broker(body)),
        other => Ok(other),
    }
}

/// A request that failed, and whether the whole frame was handed to QUIC before it did.
/// One that was not (no stream could be opened, the frame could not be written) was
/// certainly not acted on: the broker acts only on a whole frame. Once sent, a lost
/// connection or a timeout leaves the outcome unknown.
#[derive(Debug)]
pub(crate) struct Failed {
    pub error: ClientError,
    pub sent: bool,
}

impl From<Failed> for ClientError {
    fn from(failed: Failed) -> ClientError {
        failed.error
    }
}

/// Sends `request` and reads its answer, all within `timeout`, saying on failure whether
/// the request was sent. With `acknowledged: false` (`AckMode::None`) the broker answers
/// `done` once it has taken the request (queued, not written) or an error, and a stream
/// that ends without an answer also counts as taken (reads as `Done`). Either way this
/// returns only once the broker has the whole request, so a caller that exits right after
/// loses nothing in flight.
pub(crate) async fn call_tracked(
    conn: &quinn::Connection,
    request: &Request,
    body: Bytes,
    max_frame: usize,
    timeout: Duration,
    acknowledged: bool,
) -> Result<Response, Failed> {
    let frame =
        encode_request(request, body, max_frame).map_err(|error| Failed { error, sent: false })?;
    let mut sent = false;
    let result = tokio::time::timeout(timeout, async {
        let mut open = open(conn, &frame).await?;
        sent = true;
        let answer = if acknowledged {
            read_response(&mut open.recv, max_frame).await
        } else {
            match read_frame(&mut open.recv, max_frame).await? {
                None => Ok(Response::Done {}),
                Some(frame) => parse_response(&frame),
            }
        };
        drop(open.send);
        answer
    })
    .await;
    settle(result, sent)
}

/// [`call_tracked`] with a request body, for a request whose answer has a body (a group
/// poll's records): returns the response and the body. With `binary_groups` (the broker
/// agreed to `features::BINARY_GROUP_HEADERS`) a group poll or answer goes with a binary
/// header.
pub(crate) async fn call_with_body(
    conn: &quinn::Connection,
    request: &Request,
    body: Bytes,
    max_frame: usize,
    timeout: Duration,
    binary_groups: bool,
) -> Result<(Response, Bytes), Failed> {
    let header = felix_wire::binary_groups::request_header(request, binary_groups);
    let frame =
        encode_frame(header, body, max_frame).map_err(|error| Failed { error, sent: false })?;
    let mut sent = false;
    let result = tokio::time::timeout(timeout, async {
        let mut open = open(conn, &frame).await?;
        sent = true;
        let frame = read_frame(&mut open.recv, max_frame)
            .await?
            .ok_or_else(|| {
                ClientError::Protocol(
                    "the broker closed the request stream without answering".into(),
                )
            })?;
        drop(open.send);
        let response = parse_response(&frame)?;
        Ok((response, frame.body))
    })
    .await;
    settle(result, sent)
}

/// A timed exchange's outcome: its answer, or why not and whether the request was sent
/// (running out of time is [`ClientError::Timeout`], its outcome unknown once sent).
pub(crate) fn settle<T>(
    result: Result<Result<T, ClientError>, tokio::time::error::Elapsed>,
    sent: bool,
) -> Result<T, Failed> {
    match result {
        Ok(Ok(answer)) => Ok(answer),
        Ok(Err(error)) => Err(Failed { error, sent }),
        Err(_) => Err(Failed {
            error: ClientError::Timeout,
            sent,
        }),
    }
}

/// Sends `request` and reads its one response, all within `timeout`.
pub(crate) async fn call(
    conn: &quinn::Connection,
    request: &Request,
    body: Bytes,
    max_frame: usize,
    timeout: Duration,
) -> Result<Response, ClientError> {
    Ok(call_tracked(conn, request, body, max_frame, timeout, true).await?)
}
