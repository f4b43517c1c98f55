//! Frames of the QUIC client protocol: `[len u32 BE][kind u8][header_len u32 BE][header]
//! [body]`, where `len` counts everything after itself. No I/O here, and nothing about what
//! a header means: `protocol.rs` holds the typed messages a header carries (JSON), and
//! `binary.rs` the compact binary headers of cache operations.
//!
//! Invariant: decoding never reads past the frame's own length, and any bytes that are not
//! a whole, consistent frame are a typed [`FrameError`], never a panic.

use serde::{Deserialize, Serialize};

/// Bytes before the header: length, kind, header length.
pub const FRAME_PREFIX: usize = 4 + 1 + 4;
/// Default ceiling on one frame (header + body).
pub const DEFAULT_MAX_FRAME: usize = 16 * 1024 * 1024;
/// Ceiling on a frame's JSON header.
pub const MAX_HEADER: usize = 64 * 1024;

/// What kind of frame this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameKind {
    Request = 1,
    Response = 2,
    Event = 3,
}

impl FrameKind {
    fn from_u8(b: u8) -> Option<FrameKind> {
        match b {
            1 => Some(FrameKind::Request),
            2 => Some(FrameKind::Response),
            3 => Some(FrameKind::Event),
            _ => None,
        }
    }
}

/// Why bytes are not a valid frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("frame truncated: {needed} bytes needed, {available} available")]
    Truncated { needed: usize, available: usize },
    #[error("frame of {len} bytes exceeds the limit of {max}")]
    TooLarge { len: usize, max: usize },
    #[error("unknown frame kind {0}")]
    UnknownKind(u8),
    #[error("invalid frame header: {0}")]
    BadHeader(String),
    #[error("frame length fields disagree")]
    Inconsistent,
}

/// A decoded frame: its kind, its JSON header bytes and its body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub kind: FrameKind,
    pub header: Vec<u8>,
    pub body: bytes::Bytes,
}

impl Frame {
    /// Builds a frame from a typed header and a body.
    pub fn new<T: Serialize>(kind: FrameKind, header: &T, body: bytes::Bytes) -> Frame {
        Frame {
            kind,
            // Serializing our own message types cannot fail (no maps with non-string keys).
            header: serde_json::to_vec(header).unwrap_or_default(),
            body,
        }
    }

    /// The whole encoded frame.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = self.encode_head();
        out.extend_from_slice(&self.body);
        out
    }

    /// Everything but the body: length, kind, header length and header. Writing this and
    /// then the body (e.g. as two chunks to a QUIC stream) sends the frame without copying
    /// the body into a contiguous buffer.
    pub fn encode_head(&self) -> Vec<u8> {
        let len = 1 + 4 + self.header.len() + self.body.len();
        let mut out = Vec::with_capacity(FRAME_PREFIX + self.header.len());
        out.extend_from_slice(&(len as u32).to_be_bytes());
        out.push(self.kind as u8);
        out.extend_from_slice(&(self.header.len() as u32).to_be_bytes());
        out.extend_from_slice(&self.header);
        out
    }

    /// The frame's length field: bytes after the first four.
    pub fn wire_len(&self) -> usize {
        1 + 4 + self.header.len() + self.body.len()
    }

    /// Reads the total length of the frame starting at `buf` from its first 4 bytes
    /// (including those 4), refusing frames over `max`.
    pub fn peek_len(buf: &[u8], max: usize) -> Result<usize, FrameError> {
        if buf.len() < 4 {
            return Err(FrameError::Truncated {
                needed: 4,
                available: buf.len(),
            });
        }
        let len = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
        if len > max {
            return Err(FrameError::TooLarge { len, max });
        }
        if len < FRAME_PREFIX - 4 {
            return Err(FrameError::Inconsistent);
        }
        Ok(len + 4)
    }

    /// Decodes one whole frame at the start of `buf`; returns it and the bytes it used.
    pub fn decode(buf: &[u8], max: usize) -> Result<(Frame, usize), FrameError> {
        let (kind, header, body) = Frame::layout(buf, max)?;
        let frame = Frame {
            kind,
            header: buf[header].to_vec(),
            body: bytes::Bytes::copy_from_slice(&buf[body.clone()]),
        };
        Ok((frame, body.end))
    }

    /// [`Frame::decode`] with the body a slice of `buf` rather than a copy.
    pub fn decode_shared(buf: &bytes::Bytes, max: usize) -> Result<(Frame, usize), FrameError> {
        let (kind, header, body) = Frame::layout(buf, max)?;
        let frame = Frame {
            kind,
            header: buf[header].to_vec(),
            body: buf.slice(body.clone()),
        };
        Ok((frame, body.end))
    }

    /// The kind and the byte ranges of the header and the body of the frame at the start
    /// of `buf` (the body ends where the frame does).
    fn layout(
        buf: &[u8],
        max: usize,
    ) -> Result<(FrameKind, std::ops::Range<usize>, std::ops::Range<usize>), FrameError> {
        let total = Frame::peek_len(buf, max)?;
        if buf.len() < total {
            return Err(FrameError::Truncated {
                needed: total,
                available: buf.len(),
            });
        }
        let kind = FrameKind::from_u8(buf[4]).ok_or(FrameError::UnknownKind(buf[4]))?;
        let header_len = u32::from_be_bytes([buf[5], buf[6], buf[7], buf[8]]) as usize;
        if header_len > MAX_HEADER || FRAME_PREFIX + header_len > total {
            return Err(FrameError::Inconsistent);
        }
        let body_start = FRAME_PREFIX + header_len;
        Ok((kind, FRAME_PREFIX..body_start, body_start..total))
    }

    /// Parses the header as `T`.
    pub fn header<T: for<'de> Deserialize<'de>>(&self) -> Result<T, FrameError> {
        serde_json::from_slice(&self.header).map_err(|e| FrameError::BadHeader(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{AckMode, Request};

    #[test]
    fn frames_round_trip_with_header_and_body() {
        let f = Frame::new(
            FrameKind::Request,
            &Request::Publish {
                tenant: "t".into(),
                namespace: "n".into(),
                stream: "s".into(),
                shard: 2,
                ack: AckMode::Batch,
            },
            bytes::Bytes::from_static(b"batch-bytes"),
        );
        let enc = f.encode();
        let (g, used) = Frame::decode(&enc, DEFAULT_MAX_FRAME).expect("decodes");
        assert_eq!(used, enc.len());
        assert_eq!(g, f);
        let mut trailing = enc.clone();
        trailing.extend_from_slice(b"next frame");
        let (h, used) = Frame::decode_shared(&trailing.into(), DEFAULT_MAX_FRAME).expect("shared");
        assert_eq!((h, used), (f.clone(), enc.len()));
        assert!(matches!(
            g.header::<Request>(),
            Ok(Request::Publish { shard: 2, .. })
        ));
    }

    #[test]
    fn bad_frames_are_typed_errors() {
        assert!(matches!(
            Frame::decode(&[0, 0], 100),
            Err(FrameError::Truncated { .. })
        ));
        assert!(matches!(
            Frame::decode(&[0, 0, 1, 0, 1], 100),
            Err(FrameError::TooLarge { .. })
        ));
        assert!(matches!(
            Frame::decode(&[0, 0, 0, 5, 9, 0, 0, 0, 0], 100),
            Err(FrameError::UnknownKind(9))
        ));
        assert!(matches!(
            Frame::decode(&[0, 0, 0, 5, 1, 0, 0, 0, 9], 100),
            Err(FrameError::Inconsistent)
        ));
        let f = Frame {
            kind: FrameKind::Request,
            header: b"{not json".to_vec(),
            body: bytes::Bytes::new(),
        };
        let (g, _) = Frame::decode(&f.encode(), 100).expect("frame decodes");
        assert!(matches!(
            g.header::<Request>(),
            Err(FrameError::BadHeader(_))
        ));
    }
}
