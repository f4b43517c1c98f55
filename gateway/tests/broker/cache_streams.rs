//! Reused request streams (docs/protocol.md, `features::REUSED_STREAMS`) for cache
//! requests, on a raw QUIC connection and through the client: one stream carries many
//! cache requests sent back to back, each answered with its own result in the order sent,
//! refusals included; a malformed frame in the middle is refused with a typed error and
//! the requests after it are still answered; an oversized frame ends its stream, not the
//! connection; a connection that did not offer the feature keeps one request per stream.

use bytes::Bytes;
use felix_client::{Client, Condition, codes};
use felix_wire::cache::{CacheRequest, CacheResponse, MAX_VALUE_BYTES};
use felix_wire::protocol::{Frame, FrameKind, Request, Response, features};

use super::bad_input::RawConnection;
use super::common::{Broker, PATIENCE};

const T: &str = "kv";
const NS: &str = "ns";
const CACHE: &str = "reused-streams";

fn op(key: &str, make: impl FnOnce(String, String, String, String) -> CacheRequest) -> Request {
    Request::Cache(make(T.into(), NS.into(), CACHE.into(), key.into()))
}

fn put(key: &str, condition: Option<felix_wire::cache::Condition>) -> Request {
    op(key, |tenant, namespace, cache, key| CacheRequest::Put {
        tenant,
        namespace,
        cache,
        key,
        ttl_ms: None,
        condition,
    })
}

fn get(key: &str) -> Request {
    op(key, |tenant, namespace, cache, key| CacheRequest::Get {
        tenant,
        namespace,
        cache,
        key,
    })
}

fn frame(request: &Request, body: &[u8]) -> Vec<u8> {
    Frame::new(FrameKind::Request, request, Bytes::copy_from_slice(body)).encode()
}

/// Reads one answer frame off `recv`: its response and body; `None` when the stream ended.
async fn answer(recv: &mut quinn::RecvStream) -> Option<(Response, Bytes)> {
    let mut len = [0u8; 4];
    let read = tokio::time::timeout(PATIENCE, recv.read_exact(&mut len))
        .await
        .expect("an answer in time");
    match read {
        Ok(()) => {}
        Err(quinn::ReadExactError::FinishedEarly(0)) => return None,
        Err(e) => panic!("reading an answer: {e}"),
    }
    let mut buf = vec![0u8; 4 + u32::from_be_bytes(len) as usize];
    buf[..4].copy_from_slice(&len);
    tokio::time::timeout(PATIENCE, recv.read_exact(&mut buf[4..]))
        .await
        .expect("the rest of the answer in time")
        .expect("read the rest of the answer");
    let (frame, _) = Frame::decode(&buf, 1 << 24).expect("an answer frame");
    assert_eq!(frame.kind, FrameKind::Response);
    Some((frame.header().expect("a response header"), frame.body))
}

#[track_caller]
fn refused(answer: Option<(Response, Bytes)>, code: u16, reason: &str, what: &str) {
    match answer {
        Some((Response::Error(e), _)) if e.code == code && e.reason == reason => {}
        other => panic!("{what}: expected {reason} ({code}), got {other:?}"),
    }
}

/// One raw stream, ten requests written back to back before any answer is read.
pub(super) async fn a_reused_stream_answers_each_cache_request_in_turn_and_carries_on_past_a_malformed_frame(
    broker: &Broker,
    client: &Client,
) {
    client
        .create_cache(T, NS, CACHE, super::cache::durable())
        .await
        .expect("create the cache");
    let raw = RawConnection::connect(broker.quic_addr).await;
    let agreed = raw.hello_as(broker.admin_token(), features::ALL).await;
    assert_ne!(
        agreed & features::REUSED_STREAMS,
        0,
        "the broker offers reused streams"
    );

    let counter = op("hits", |tenant, namespace, cache, key| {
        CacheRequest::CounterAdd {
            tenant,
            namespace,
            cache,
            key,
            delta: 5,
        }
    });
    let mut unknown = put("k1", None);
    if let Request::Cache(CacheRequest::Put { cache, .. }) = &mut unknown {
        *cache = "no-such-cache".into();
    }
    let delete = op("k1", |tenant, namespace, cache, key| CacheRequest::Delete {
        tenant,
        namespace,
        cache,
        key,
        condition: None,
    });
    // A whole frame whose header is not JSON, and one of an unknown kind: both read whole,
    // so the stream's next frame is where it should be.
    let mut bad_header = vec![0, 0, 0, 0, FrameKind::Request as u8, 0, 0, 0, 9];
    bad_header.extend_from_slice(b"{not json");
    let n = (bad_header.len() - 4) as u32;
    bad_header[..4].copy_from_slice(&n.to_be_bytes());
    let mut bad_kind = frame(&get("k1"), b"");
    bad_kind[4] = 9;
    let frames = [
        frame(&put("k1", None), b"v1"),
        frame(&put("k1", Some(felix_wire::cache::Condition::Absent)), b"x"),
        frame(&get("k1"), b""),
        bad_header,
        bad_kind,
        frame(&put("k2", None), &vec![b'z'; MAX_VALUE_BYTES + 1]),
        frame(&counter, b""),
        frame(&unknown, b"v"),
        frame(&get("k2"), b""),
        frame(&delete, b""),
    ];
    let (mut send, mut recv) = raw.conn.open_bi().await.expect("open a stream");
    for f in &frames {
        send.write_all(f).await.expect("write a request frame");
    }

    let version = match answer(&mut recv).await {
        Some((Response::Cache(CacheResponse::Written { version }), _)) => version,
        other => panic!("1st: the put is answered with its version, got {other:?}"),
    };
    refused(
        answer(&mut recv).await,
        codes::VERSION_CONFLICT,
        "version_conflict",
        "2nd: a put-if-absent on a key that holds a value",
    );
    match answer(&mut recv).await {
        Some((
            Response::Cache(CacheResponse::Value {
                found: true,
                version: v,
                ..
            }),
            body,
        )) => {
            assert_eq!(
                (v, &body[..]),
                (version, &b"v1"[..]),
                "3rd: the get reads the put"
            )
        }
        other => panic!("3rd: the get finds the put's value, got {other:?}"),
    }
    refused(
        answer(&mut recv).await,
        codes::BAD_REQUEST,
        "malformed_request",
        "4th: a frame whose header is not JSON",
    );
    refused(
        answer(&mut recv).await,
        codes::BAD_REQUEST,
        "malformed_frame",
        "5th: a frame of an unknown kind",
    );
    refused(
        answer(&mut recv).await,
        codes::VALUE_TOO_LARGE,
        "value_too_large",
        "6th: a value over the limit",
    );
    match answer(&mut recv).await {
        Some((Response::Cache(CacheResponse::Counter { value: 5, .. }), _)) => {}
        other => panic!("7th: the counter add is answered with 5, got {other:?}"),
    }
    refused(
        answer(&mut recv).await,
        codes::UNKNOWN_CACHE,
        "unknown_cache",
        "8th: a put to a cache that does not exist",
    );
    match answer(&mut recv).await {
        Some((Response::Cache(CacheResponse::Value { found: false, .. }), _)) => {}
        other => panic!("9th: the refused oversized put wrote nothing, got {other:?}"),
    }
    match answer(&mut recv).await {
        Some((Response::Cache(CacheResponse::Deleted { existed: true }), _)) => {}
        other => panic!("10th: the delete found the put's value, got {other:?}"),
    }
    // Ending our side ends the stream after the last answer.
    send.finish().expect("finish");
    assert!(
        answer(&mut recv).await.is_none(),
        "nothing after the last answer"
    );

    // A frame over the limit cannot be skipped: it ends its own stream, not the connection.
    let (mut send, mut recv) = raw.conn.open_bi().await.expect("open a stream");
    send.write_all(&frame(&get("k1"), b""))
        .await
        .expect("write");
    let _ = send.write_all(&u32::MAX.to_be_bytes()).await;
    match answer(&mut recv).await {
        Some((Response::Cache(CacheResponse::Value { found: false, .. }), _)) => {}
        other => panic!("the get before an oversized frame is answered, got {other:?}"),
    }
    refused(
        answer(&mut recv).await,
        codes::FRAME_TOO_LARGE,
        "frame_too_large",
        "a frame over the limit",
    );
    assert!(answer(&mut recv).await.is_none(), "the stream ends there");
    let (mut send, mut recv) = raw.conn.open_bi().await.expect("open another stream");
    send.write_all(&frame(&get("hits"), b""))
        .await
        .expect("write");
    match answer(&mut recv).await {
        Some((Response::Cache(CacheResponse::Value { found: true, .. }), body)) => {
            assert_eq!(&body[..], b"5", "the counter, on another stream")
        }
        other => panic!("another stream of the connection still works, got {other:?}"),
    }

    // A client that did not offer the feature gets one answer per stream, and the stream
    // ends after it even though the client never finished its side.
    let old = RawConnection::connect(broker.quic_addr).await;
    let agreed = old
        .hello_as(
            broker.admin_token(),
            features::ALL & !features::REUSED_STREAMS,
        )
        .await;
    assert_eq!(agreed & features::REUSED_STREAMS, 0);
    let (mut send, mut recv) = old.conn.open_bi().await.expect("open a stream");
    send.write_all(&frame(&get("hits"), b""))
        .await
        .expect("write");
    assert!(
        matches!(answer(&mut recv).await, Some((Response::Cache(_), _))),
        "answered"
    );
    assert!(
        answer(&mut recv).await.is_none(),
        "an old client's stream ends after its one answer"
    );

    // Through the client: many operations at once on one connection, each answered with
    // its own result, conditional ones refused as they should be.
    let conn = broker.client().await;
    let puts = (0..64).map(|i| {
        let conn = conn.clone();
        async move {
            conn.cache_put(
                T,
                NS,
                CACHE,
                &format!("many-{i}"),
                Bytes::from(format!("value-{i}")),
                None,
            )
            .await
        }
    });
    for (i, r) in futures::future::join_all(puts)
        .await
        .into_iter()
        .enumerate()
    {
        r.unwrap_or_else(|e| panic!("put {i}: {e}"));
    }
    let ops = (0..64).map(|i| {
        let conn = conn.clone();
        async move {
            let key = format!("many-{i}");
            let won = conn
                .cache_put_if(
                    T,
                    NS,
                    CACHE,
                    &key,
                    Bytes::from("again"),
                    None,
                    Condition::Absent,
                )
                .await;
            let got = conn.cache_get(T, NS, CACHE, &key).await;
            (won, got)
        }
    });
    for (i, (won, got)) in futures::future::join_all(ops).await.into_iter().enumerate() {
        match won {
            Err(felix_client::ClientError::Broker(e)) if e.code == codes::VERSION_CONFLICT => {}
            other => panic!("put-if-absent {i} is refused, got {other:?}"),
        }
        let got = got
            .unwrap_or_else(|e| panic!("get {i}: {e}"))
            .expect("found");
        assert_eq!(
            got,
            Bytes::from(format!("value-{i}")),
            "get {i} reads its own value"
        );
    }
}
