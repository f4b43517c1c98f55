//! Binary headers for the cache's key operations (docs/protocol.md,
//! `features::BINARY_CACHE_HEADERS`), on a raw QUIC connection and through the client: a
//! binary request is answered in binary (errors in JSON), a JSON request on the same
//! connection in JSON, both reading and writing the same entries; a malformed binary header
//! is refused with `malformed_request`, changes nothing, and the stream carries on; a
//! client whose broker did not agree to the feature sends JSON and is served as before.

use bytes::Bytes;
use felix_client::{ClientConfig, Connection, codes};
use felix_wire::binary;
use felix_wire::cache::{CacheRequest, CacheResponse, Condition};
use felix_wire::protocol::{Frame, FrameKind, Request, Response, features};

use super::bad_input::RawConnection;
use super::common::{Broker, PATIENCE};

const T: &str = "kv";
const NS: &str = "ns";
const CACHE: &str = "binary-headers";

fn put(key: &str, condition: Option<Condition>) -> CacheRequest {
    CacheRequest::Put {
        tenant: T.into(),
        namespace: NS.into(),
        cache: CACHE.into(),
        key: key.into(),
        ttl_ms: Some(600_000),
        condition,
    }
}

fn get(key: &str) -> CacheRequest {
    CacheRequest::Get {
        tenant: T.into(),
        namespace: NS.into(),
        cache: CACHE.into(),
        key: key.into(),
    }
}

/// A request frame with a binary header.
fn binary_frame(request: &CacheRequest, body: &[u8]) -> Vec<u8> {
    let header = binary::encode_request(request).expect("a key operation");
    raw_frame(header, body)
}

fn raw_frame(header: Vec<u8>, body: &[u8]) -> Vec<u8> {
    Frame {
        kind: FrameKind::Request,
        header,
        body: Bytes::copy_from_slice(body),
    }
    .encode()
}

fn json_frame(request: CacheRequest, body: &[u8]) -> Vec<u8> {
    Frame::new(
        FrameKind::Request,
        &Request::Cache(request),
        Bytes::copy_from_slice(body),
    )
    .encode()
}

/// One answer frame: whether its header was binary, the response and the body.
async fn answer(recv: &mut quinn::RecvStream) -> (bool, Response, Bytes) {
    let mut len = [0u8; 4];
    tokio::time::timeout(PATIENCE, recv.read_exact(&mut len))
        .await
        .expect("an answer in time")
        .expect("read an answer's length");
    let mut buf = vec![0u8; 4 + u32::from_be_bytes(len) as usize];
    buf[..4].copy_from_slice(&len);
    tokio::time::timeout(PATIENCE, recv.read_exact(&mut buf[4..]))
        .await
        .expect("the rest of the answer in time")
        .expect("read the rest of the answer");
    let (frame, _) = Frame::decode(&buf, 1 << 24).expect("an answer frame");
    assert_eq!(frame.kind, FrameKind::Response);
    let response = binary::read_response(&frame.header).expect("a response header");
    (binary::is_binary(&frame.header), response, frame.body)
}

pub(super) async fn binary_cache_headers_are_answered_in_kind_and_a_malformed_one_changes_nothing(
    broker: &Broker,
    conn: &Connection,
) {
    conn.create_cache(T, NS, CACHE, super::cache::durable())
        .await
        .expect("create the cache");
    let raw = RawConnection::connect(broker.quic_addr).await;
    let agreed = raw.hello_as(broker.admin_token(), features::ALL).await;
    assert_ne!(
        agreed & features::BINARY_CACHE_HEADERS,
        0,
        "the broker offers binary cache headers"
    );

    let (mut send, mut recv) = raw.conn.open_bi().await.expect("open a stream");
    send.write_all(&binary_frame(&put("k", None), b"v1"))
        .await
        .expect("write");
    let version = match answer(&mut recv).await {
        (true, Response::Cache(CacheResponse::Written { version }), _) => version,
        other => panic!("a binary put is answered in binary with its version, got {other:?}"),
    };
    send.write_all(&binary_frame(&get("k"), b""))
        .await
        .expect("write");
    match answer(&mut recv).await {
        (
            true,
            Response::Cache(CacheResponse::Value {
                found: true,
                version: v,
                ttl_ms: Some(ttl),
            }),
            body,
        ) => {
            assert_eq!((v, &body[..]), (version, &b"v1"[..]));
            assert!(ttl > 0 && ttl <= 600_000, "ttl left {ttl}");
        }
        other => panic!("a binary get reads the put in binary, got {other:?}"),
    }
    // The same entry through a JSON header, on the same stream: answered in JSON.
    send.write_all(&json_frame(get("k"), b""))
        .await
        .expect("write");
    match answer(&mut recv).await {
        (false, Response::Cache(CacheResponse::Value { found: true, .. }), body) => {
            assert_eq!(&body[..], b"v1")
        }
        other => panic!("a JSON get is answered in JSON, got {other:?}"),
    }
    // A refusal of a binary request is a JSON error.
    send.write_all(&binary_frame(&put("k", Some(Condition::Absent)), b"x"))
        .await
        .expect("write");
    match answer(&mut recv).await {
        (false, Response::Error(e), _) if e.code == codes::VERSION_CONFLICT => {}
        other => panic!("a refused binary put-if-absent gets version_conflict, got {other:?}"),
    }
    // Malformed: a put whose header lacks its TTL, and one with an unknown operation.
    let mut cut = binary::encode_request(&put("bad", None)).expect("encodes");
    cut.truncate(cut.len() - 3);
    let mut unknown_op = binary::encode_request(&put("bad", None)).expect("encodes");
    unknown_op[1] = 42;
    for (header, why) in [(cut, "cut short"), (unknown_op, "unknown operation 42")] {
        send.write_all(&raw_frame(header, b"never stored"))
            .await
            .expect("write");
        match answer(&mut recv).await {
            (false, Response::Error(e), _)
                if e.code == codes::BAD_REQUEST
                    && e.reason == "malformed_request"
                    && e.message.contains(why) => {}
            other => panic!("a malformed binary header ({why}) is refused, got {other:?}"),
        }
    }
    // Nothing was stored, and the stream still carries requests.
    send.write_all(&binary_frame(&get("bad"), b""))
        .await
        .expect("write");
    match answer(&mut recv).await {
        (true, Response::Cache(CacheResponse::Value { found: false, .. }), _) => {}
        other => panic!("nothing of the malformed puts was stored, got {other:?}"),
    }
    let _ = send.finish();

    // A client whose broker did not agree to the feature (as an older broker would not)
    // sends JSON headers and is served as before, reading what binary requests wrote.
    let config = ClientConfig {
        token: broker.admin_token(),
        features: features::ALL & !features::BINARY_CACHE_HEADERS,
        ..ClientConfig::default()
    };
    let old = Connection::connect(&broker.quic_addr.to_string(), config)
        .await
        .expect("connect");
    assert!(!old.has_feature(features::BINARY_CACHE_HEADERS));
    let got = old
        .cache_get(T, NS, CACHE, "k")
        .await
        .expect("get")
        .expect("found");
    assert_eq!(got, Bytes::from_static(b"v1"));
    old.cache_put(T, NS, CACHE, "k2", Bytes::from_static(b"v2"), None)
        .await
        .expect("put");
    let added = old
        .counter_add(T, NS, CACHE, "hits", 3)
        .await
        .expect("counter add");
    // And this client, which agreed, reads and writes the same entries in binary.
    assert!(conn.has_feature(features::BINARY_CACHE_HEADERS));
    let got = conn
        .cache_get(T, NS, CACHE, "k2")
        .await
        .expect("get")
        .expect("found");
    assert_eq!(got, Bytes::from_static(b"v2"));
    assert_eq!(
        conn.counter_add(T, NS, CACHE, "hits", 4)
            .await
            .expect("counter add"),
        added + 4
    );
    assert!(conn.cache_delete(T, NS, CACHE, "k2").await.expect("delete"));
    assert_eq!(old.cache_get(T, NS, CACHE, "k2").await.expect("get"), None);
}
