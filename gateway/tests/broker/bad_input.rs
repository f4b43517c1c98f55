//! Bad input is answered, never fatal, and changes nothing (spec: "Existence Enforcement";
//! the protocol's typed errors): unknown names get their own codes, an oversized batch is
//! refused whole, malformed frames sent on a raw QUIC connection get `bad_request` or
//! `frame_too_large` on their own stream while the connection carries on, and a publish cut
//! off mid-frame is never applied.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use bytes::Bytes;
use felix_client::{AckMode, ClientError, Connection, Message, StartAt, StreamConfig, codes};
use felix_wire::protocol::{
    AckMode as WireAck, Frame, FrameKind, PROTOCOL_VERSION, Request, Response, features,
};
use felix_wire::{BatchBuilder, Compression, Record};

use super::common::{Broker, BrokerOptions, PATIENCE, durable_stream, read_until};

const TENANT: &str = "acme";
const NS: &str = "prod";
const STREAM: &str = "orders";
const SHARDS: u32 = 2;
const MAX_BATCH: usize = 64 * 1024;

/// A QUIC connection that speaks frames byte by byte, bypassing felix-client.
pub(super) struct RawConnection {
    _endpoint: quinn::Endpoint,
    pub(super) conn: quinn::Connection,
}

impl RawConnection {
    pub(super) async fn connect(addr: SocketAddr) -> RawConnection {
        let config = felix_client::tls::client_config("127.0.0.1", addr.ip(), None, false)
            .expect("client TLS config for a loopback broker");
        let endpoint =
            quinn::Endpoint::client(SocketAddr::from(([127, 0, 0, 1], 0))).expect("UDP socket");
        let conn = endpoint
            .connect_with(config, addr, "localhost")
            .expect("connect")
            .await
            .expect("QUIC handshake");
        RawConnection {
            _endpoint: endpoint,
            conn,
        }
    }

    /// Writes `bytes` on a new stream, finishes it, and reads the one response frame back.
    async fn exchange(&self, bytes: &[u8]) -> Response {
        let (mut send, mut recv) = self.conn.open_bi().await.expect("open a stream");
        // The broker may stop reading early (an oversized frame): its answer is still sent.
        let _ = send.write_all(bytes).await;
        let _ = send.finish();
        let buf = tokio::time::timeout(PATIENCE, recv.read_to_end(1 << 20))
            .await
            .expect("an answer in time")
            .expect("read the answer");
        let (frame, used) = Frame::decode(&buf, 1 << 20)
            .unwrap_or_else(|e| panic!("the answer is not a frame ({e}): {buf:?}"));
        assert_eq!(used, buf.len(), "one frame and nothing after it");
        assert_eq!(frame.kind, FrameKind::Response);
        frame.header::<Response>().expect("a response header")
    }

    async fn request(&self, request: &Request, body: Bytes) -> Response {
        self.exchange(&Frame::new(FrameKind::Request, request, body).encode())
            .await
    }

    async fn hello(&self) {
        self.hello_as(None, features::ALL).await;
    }

    /// Says hello with `token`, offering `offered`; the features the broker agreed to.
    pub(super) async fn hello_as(&self, token: Option<String>, offered: u64) -> u64 {
        let hello = Request::Hello {
            token,
            version: PROTOCOL_VERSION,
            features: offered,
            client: "raw-test".into(),
        };
        match self.request(&hello, Bytes::new()).await {
            Response::HelloOk { features, .. } => features,
            other => panic!("hello answered {other:?}"),
        }
    }
}

fn publish_request(shard: u32) -> Request {
    Request::Publish {
        tenant: TENANT.into(),
        namespace: NS.into(),
        stream: STREAM.into(),
        shard,
        ack: WireAck::Batch,
    }
}

fn describe_request() -> Request {
    Request::DescribeStream {
        tenant: TENANT.into(),
        namespace: NS.into(),
        name: STREAM.into(),
    }
}

fn batch(payloads: &[&[u8]]) -> Bytes {
    let mut b = BatchBuilder::new(Compression::None);
    for p in payloads {
        b.push(Record::value(1_700_000_000_000, Bytes::copy_from_slice(p)));
    }
    Bytes::from(b.build().expect("batch encodes"))
}

#[track_caller]
fn assert_error(response: &Response, allowed: &[u16], what: &str) {
    match response {
        Response::Error(body) if allowed.contains(&body.code) => {}
        other => panic!("{what}: expected an error with a code in {allowed:?}, got {other:?}"),
    }
}

#[track_caller]
fn assert_broker_code<T: std::fmt::Debug>(result: Result<T, ClientError>, code: u16, what: &str) {
    match result {
        Err(ClientError::Broker(body)) if body.code == code => {}
        other => panic!("{what}: expected broker error {code}, got {other:?}"),
    }
}

/// Each shard's next offset, as the broker describes the stream.
async fn shard_ends(client: &Connection) -> BTreeMap<u32, u64> {
    let info = client
        .describe_stream(TENANT, NS, STREAM)
        .await
        .expect("describe stream");
    info.shards
        .iter()
        .map(|s| (s.shard, s.next_offset))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_typed_errors_and_changes_nothing() {
    let broker = Broker::start(BrokerOptions::new().env("FELIX_MAX_BATCH_BYTES", MAX_BATCH)).await;
    let client = broker.client().await;
    durable_stream(&client, TENANT, NS, STREAM, SHARDS).await;

    // Acknowledged records to keep an eye on, on both shards.
    let mut acked: BTreeMap<(u32, u64), Bytes> = BTreeMap::new();
    for i in 0..24 {
        let payload = Bytes::from(format!("record-{i}"));
        let p = client
            .publish(
                TENANT,
                NS,
                STREAM,
                Message::new(payload.clone()).with_key(format!("key-{i}")),
                AckMode::Batch,
            )
            .await
            .expect("publish")
            .expect("acknowledged");
        acked.insert((p.shard, p.base_offset), payload);
    }
    // Open every shard on the broker so the description lists each one.
    for shard in 0..SHARDS {
        drop(
            client
                .subscribe(TENANT, NS, STREAM, shard, StartAt::Latest)
                .await
                .expect("subscribe"),
        );
    }
    let before = shard_ends(&client).await;
    assert_eq!(
        before.len(),
        SHARDS as usize,
        "every shard described: {before:?}"
    );
    assert_eq!(before.values().sum::<u64>(), 24);

    // Unknown names, each with its own code: directly (subscribe) and through a publish.
    let sub = |t: &'static str, ns: &'static str, s: &'static str, shard: u32| {
        client.subscribe(t, ns, s, shard, StartAt::Earliest)
    };
    assert_broker_code(
        sub("nobody", NS, STREAM, 0).await,
        codes::UNKNOWN_TENANT,
        "subscribe, unknown tenant",
    );
    assert_broker_code(
        sub(TENANT, "nowhere", STREAM, 0).await,
        codes::UNKNOWN_NAMESPACE,
        "subscribe, unknown namespace",
    );
    assert_broker_code(
        sub(TENANT, NS, "missing", 0).await,
        codes::UNKNOWN_STREAM,
        "subscribe, unknown stream",
    );
    assert_broker_code(
        sub(TENANT, NS, STREAM, SHARDS).await,
        codes::UNKNOWN_SHARD,
        "subscribe, unknown shard",
    );
    assert_broker_code(
        client
            .subscribe(TENANT, NS, STREAM, 0, StartAt::Offset(1_000_000))
            .await,
        codes::OFFSET_OUT_OF_RANGE,
        "subscribe past the end of the shard",
    );
    let publish = |t: &'static str, ns: &'static str, s: &'static str| {
        client.publish(t, ns, s, Message::new("x"), AckMode::Batch)
    };
    assert_broker_code(
        publish("nobody", NS, STREAM).await,
        codes::UNKNOWN_TENANT,
        "publish, unknown tenant",
    );
    assert_broker_code(
        publish(TENANT, "nowhere", STREAM).await,
        codes::UNKNOWN_NAMESPACE,
        "publish, unknown namespace",
    );
    assert_broker_code(
        publish(TENANT, NS, "missing").await,
        codes::UNKNOWN_STREAM,
        "publish, unknown stream",
    );
    let durable = || StreamConfig {
        durable: Some(true),
        ..Default::default()
    };
    assert_broker_code(
        client.create_stream("nobody", NS, "s", durable()).await,
        codes::UNKNOWN_TENANT,
        "create stream, unknown tenant",
    );
    assert_broker_code(
        client
            .create_stream(TENANT, "nowhere", "s", durable())
            .await,
        codes::UNKNOWN_NAMESPACE,
        "create stream, unknown namespace",
    );

    // A record over max_batch_bytes is refused, alone or among small ones: nothing lands.
    let big = Bytes::from(vec![b'x'; 200 * 1024]);
    assert_broker_code(
        client
            .publish(
                TENANT,
                NS,
                STREAM,
                Message::new(big.clone()).with_key("key-0"),
                AckMode::Batch,
            )
            .await,
        codes::RECORD_TOO_LARGE,
        "publish a 200 KiB record",
    );
    let mixed = vec![
        Message::new("small-1").with_key("key-0"),
        Message::new(big).with_key("key-0"),
        Message::new("small-2").with_key("key-0"),
    ];
    assert_broker_code(
        client
            .publish_batch(TENANT, NS, STREAM, mixed, AckMode::Batch)
            .await,
        codes::RECORD_TOO_LARGE,
        "publish a batch holding a 200 KiB record",
    );
    // What a batch becomes counts, not what it costs on the wire: 1 MiB of zeros compresses to
    // well under the 64 KiB limit (snappy: ~50 KiB, zstd: ~100 bytes) and decompresses to 16x it.
    for codec in [
        Compression::Zstd,
        Compression::Gzip,
        Compression::Lz4,
        Compression::Snappy,
    ] {
        let mut b = BatchBuilder::new(codec);
        b.push(Record::value(1_700_000_000_000, vec![0u8; 1 << 20]));
        let bomb = Bytes::from(b.build().expect("batch encodes"));
        assert!(
            bomb.len() < MAX_BATCH,
            "{codec:?}: {} bytes on the wire",
            bomb.len()
        );
        assert_broker_code(
            client
                .publish_raw(TENANT, NS, STREAM, 0, bomb, AckMode::Batch)
                .await,
            codes::RECORD_TOO_LARGE,
            &format!("publish a {codec:?} batch that decompresses to 1 MiB"),
        );
    }
    assert_eq!(
        shard_ends(&client).await,
        before,
        "a refused batch appends nothing"
    );

    // Raw frames. Before Hello: refused, whatever the request.
    let raw = RawConnection::connect(broker.quic_addr).await;
    let r = raw.request(&describe_request(), Bytes::new()).await;
    assert_error(&r, &[codes::BAD_REQUEST], "a request before hello");
    let r = raw
        .request(&publish_request(0), batch(&[b"before-hello"]))
        .await;
    assert_error(&r, &[codes::BAD_REQUEST], "a publish before hello");

    // Garbage: an HTTP request, an unknown frame kind, a length too small for a frame, a
    // header that is not JSON, an event frame from a client, and a request with no type.
    let not_json = Frame {
        kind: FrameKind::Request,
        header: b"{not json".to_vec(),
        body: Bytes::new(),
    };
    let event = Frame {
        kind: FrameKind::Event,
        header: br#"{"type":"records","first_offset":0,"next_offset":1}"#.to_vec(),
        body: Bytes::new(),
    };
    let untyped = Frame {
        kind: FrameKind::Request,
        header: br#"{"tenant":"acme"}"#.to_vec(),
        body: Bytes::new(),
    };
    let garbage: Vec<(&str, Vec<u8>)> = vec![
        (
            "an HTTP request",
            b"GET / HTTP/1.1\r\nHost: felix\r\n\r\n".to_vec(),
        ),
        ("an unknown frame kind", vec![0, 0, 0, 5, 9, 0, 0, 0, 0]),
        ("a frame shorter than its prefix", vec![0, 0, 0, 1, 1]),
        (
            "a header length past the frame",
            vec![0, 0, 0, 6, 1, 0, 0, 0, 200, b'{'],
        ),
        ("a header that is not JSON", not_json.encode()),
        ("an event frame", event.encode()),
        ("a request without a type", untyped.encode()),
    ];
    for (what, bytes) in &garbage {
        let r = raw.exchange(bytes).await;
        assert_error(&r, &[codes::BAD_REQUEST, codes::FRAME_TOO_LARGE], what);
    }
    // A frame that declares 1 GiB is refused from its length alone.
    let mut huge = (1u32 << 30).to_be_bytes().to_vec();
    huge.extend_from_slice(&[1, 0, 0, 0, 2, b'{', b'}']);
    assert_error(
        &raw.exchange(&huge).await,
        &[codes::FRAME_TOO_LARGE],
        "a frame declaring 1 GiB",
    );

    // The same connection carries on: Hello, then real requests.
    raw.hello().await;
    match raw.request(&describe_request(), Bytes::new()).await {
        Response::Stream { stream } => assert_eq!(stream.name, STREAM),
        other => panic!("describe after the garbage answered {other:?}"),
    }
    let r = raw
        .request(&publish_request(SHARDS + 5), batch(&[b"nowhere"]))
        .await;
    assert_error(
        &r,
        &[codes::UNKNOWN_SHARD],
        "a publish to a shard that does not exist",
    );
    let r = raw.request(&publish_request(0), Bytes::new()).await;
    assert_error(&r, &[codes::BAD_REQUEST], "a publish without a batch");
    let mut corrupt = batch(&[b"corrupt"]).to_vec();
    let last = corrupt.len() - 1;
    corrupt[last] ^= 0xff;
    let r = raw.request(&publish_request(0), Bytes::from(corrupt)).await;
    assert_error(
        &r,
        &[codes::BAD_REQUEST],
        "a batch whose CRC does not match",
    );
    let mut trailing = batch(&[b"trailing"]).to_vec();
    trailing.extend_from_slice(b"junk");
    let r = raw
        .request(&publish_request(0), Bytes::from(trailing))
        .await;
    assert_error(&r, &[codes::BAD_REQUEST], "a batch followed by junk");
    let r = raw
        .request(&publish_request(0), batch(&[&vec![b'y'; 100 * 1024]]))
        .await;
    assert_error(
        &r,
        &[codes::RECORD_TOO_LARGE],
        "a raw batch over max_batch_bytes",
    );

    // A publish cut off mid-frame: the stream reset after half the frame, and after all but
    // its last byte; then a connection closed with half a frame written.
    let whole = Frame::new(
        FrameKind::Request,
        &publish_request(0),
        batch(&[&b"cut-off"[..]; 8]),
    )
    .encode();
    for cut in [whole.len() / 2, whole.len() - 1] {
        let (mut send, _recv) = raw.conn.open_bi().await.expect("open a stream");
        send.write_all(&whole[..cut])
            .await
            .expect("write part of a frame");
        send.reset(0u32.into()).expect("reset the stream");
    }
    {
        let dropped = RawConnection::connect(broker.quic_addr).await;
        dropped.hello().await;
        let (mut send, _recv) = dropped.conn.open_bi().await.expect("open a stream");
        send.write_all(&whole[..whole.len() / 2])
            .await
            .expect("write half a frame");
        dropped.conn.close(0u32.into(), b"gone mid-publish");
    }
    // The raw connection still works after the resets.
    match raw.request(&describe_request(), Bytes::new()).await {
        Response::Stream { .. } => {}
        other => panic!("describe after the resets answered {other:?}"),
    }

    // Nothing changed, and a normal client keeps working: the next records land exactly at
    // the old ends and every acknowledged record is still there, with nothing in between.
    assert_eq!(
        shard_ends(&client).await,
        before,
        "bad input appended nothing"
    );
    let after: Vec<Message> = (0..24)
        .map(|i| Message::new(format!("after-{i}")).with_key(format!("key-{i}")))
        .collect();
    let published = client
        .publish_batch_detailed(TENANT, NS, STREAM, after, AckMode::Batch)
        .await
        .expect("publish after the bad input");
    for outcome in published {
        let p = outcome
            .result
            .expect("publish after the bad input")
            .expect("acknowledged");
        assert_eq!(
            p.base_offset, before[&p.shard],
            "shard {}: the next record lands at the old end",
            p.shard
        );
        for (i, idx) in outcome.indices.iter().enumerate() {
            acked.insert(
                (p.shard, p.offset_of(i)),
                Bytes::from(format!("after-{idx}")),
            );
        }
    }
    for shard in 0..SHARDS {
        let expected: Vec<(u64, Bytes)> = acked
            .range((shard, 0)..=(shard, u64::MAX))
            .map(|((_, o), p)| (*o, p.clone()))
            .collect();
        let end = expected.last().map_or(0, |(o, _)| o + 1);
        let mut sub = client
            .subscribe(TENANT, NS, STREAM, shard, StartAt::Earliest)
            .await
            .expect("subscribe from earliest");
        let got: Vec<(u64, Bytes)> = read_until(&mut sub, end, &format!("shard {shard}"))
            .await
            .into_iter()
            .map(|e| (e.offset, e.payload))
            .collect();
        assert_eq!(
            got, expected,
            "shard {shard} holds exactly the acknowledged records"
        );
    }
}
