//! One QUIC protocol frame, as a broker reads it from a client's stream (and a client from
//! the broker's): `Frame::peek_len` and `Frame::decode` under a size limit, then the JSON
//! header parsed as a `Request`, a `Response` and an `Event`. Any input must give Ok or a
//! typed error; a frame that decodes must re-encode to the same bytes, and a header that
//! parses must survive a round trip through `Frame::new`.
//!
//! Each input is checked twice: as it is (the first two bytes pick a small limit, so "over
//! the limit" paths get exercised too), and "forged" into a whole frame — kind from the first
//! byte, the rest as the header — so random bytes reach the JSON parser. A JSON seed such as
//! `\x01{"type":"hello","version":1,"features":3}` forges to a valid request.
#![no_main]

use felix_wire::protocol::{
    DEFAULT_MAX_FRAME, Event, FRAME_PREFIX, Frame, FrameError, FrameKind, MAX_HEADER, Request,
    Response,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (max, buf) = match data {
        [a, b, rest @ ..] => (
            (FRAME_PREFIX - 4) + (u16::from_be_bytes([*a, *b]) as usize) * 4,
            rest,
        ),
        _ => (DEFAULT_MAX_FRAME, data),
    };
    for max in [max, DEFAULT_MAX_FRAME] {
        check(buf, max);
    }
    if let Some(forged) = forge(data) {
        check(&forged, DEFAULT_MAX_FRAME);
    }
});

/// Parses the frame's header as `$t`: either a typed `BadHeader` error, or a message that
/// `Frame::new` serializes back to an equal one.
macro_rules! round_trip {
    ($frame:expr, $t:ty) => {
        match $frame.header::<$t>() {
            Ok(msg) => {
                let again = Frame::new($frame.kind, &msg, $frame.body.clone());
                assert_eq!(again.header::<$t>(), Ok(msg));
            }
            Err(e) => assert!(matches!(e, FrameError::BadHeader(_)), "{e:?}"),
        }
    };
}

fn check(buf: &[u8], max: usize) {
    let peeked = Frame::peek_len(buf, max);
    match Frame::decode(buf, max) {
        Ok((frame, used)) => {
            assert_eq!(peeked, Ok(used));
            assert!(used <= buf.len());
            assert!(used - 4 <= max);
            assert!(frame.header.len() <= MAX_HEADER);
            assert_eq!(
                frame.encode(),
                &buf[..used],
                "decode then encode changed the frame"
            );
            round_trip!(frame, Request);
            round_trip!(frame, Response);
            round_trip!(frame, Event);
        }
        Err(e) => {
            // decode fails where peek_len does, with the same error.
            if let Err(p) = peeked {
                assert_eq!(e, p);
            }
        }
    }
}

/// `data` as one whole frame: the kind from the first byte, the rest (up to the header
/// limit) as the JSON header, anything beyond as the body.
fn forge(data: &[u8]) -> Option<Vec<u8>> {
    let (first, rest) = data.split_first()?;
    let kind = [FrameKind::Request, FrameKind::Response, FrameKind::Event][*first as usize % 3];
    let (header, body) = rest.split_at(rest.len().min(MAX_HEADER));
    let frame = Frame {
        kind,
        header: header.to_vec(),
        body: body.to_vec().into(),
    };
    Some(frame.encode())
}
