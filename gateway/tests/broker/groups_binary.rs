//! Binary headers for the groups' polls and answers (docs/protocol.md,
//! `features::BINARY_GROUP_HEADERS`) on a raw QUIC connection: a binary poll, extend and
//! ack are answered in binary with the same records, attempts and outcome as the same
//! requests in JSON on a twin group; a malformed binary header is refused with
//! `malformed_request` and changes nothing; a client that did not agree sends JSON and is
//! served as before.

use std::time::Duration;

use bytes::Bytes;
use felix_client::{AckMode, Client, ClientConfig, Connection, Message, codes};
use felix_wire::groups::{ClaimRef, ClaimedMeta, GroupRequest, GroupResponse};
use felix_wire::protocol::{Frame, FrameKind, Request, Response, features};
use felix_wire::{BatchIter, DecodedBatch, binary, binary_groups};

use super::bad_input::RawConnection;
use super::common::{Broker, PATIENCE};

const T: &str = "groups";
const NS: &str = "ns";
const STREAM: &str = "binary-headers";

/// One answer frame on `recv`: whether its header was a binary group one, the response and
/// the body.
async fn answer(recv: &mut quinn::RecvStream) -> (bool, Response, Bytes) {
    let buf = tokio::time::timeout(PATIENCE, recv.read_to_end(1 << 24))
        .await
        .expect("an answer in time")
        .expect("read the answer");
    let (frame, used) = Frame::decode(&buf, 1 << 24).expect("an answer frame");
    assert_eq!((frame.kind, used), (FrameKind::Response, buf.len()));
    let response = binary::read_response(&frame.header).expect("a response header");
    (
        binary_groups::is_binary(&frame.header),
        response,
        frame.body,
    )
}

/// Sends one request frame of `header` on a stream of its own and reads the answer.
async fn exchange(raw: &RawConnection, header: Vec<u8>) -> (bool, Response, Bytes) {
    let (mut send, mut recv) = raw.conn.open_bi().await.expect("open a stream");
    let frame = Frame {
        kind: FrameKind::Request,
        header,
        body: Bytes::new(),
    };
    send.write_all(&frame.encode()).await.expect("write");
    let _ = send.finish();
    answer(&mut recv).await
}

fn json(request: &GroupRequest) -> Vec<u8> {
    serde_json::to_vec(&Request::Group(request.clone())).expect("JSON")
}

fn bin(request: &GroupRequest) -> Vec<u8> {
    binary_groups::encode_request(request).expect("a hot request has a binary header")
}

fn poll(group: &str, max_records: u32) -> GroupRequest {
    GroupRequest::Poll {
        tenant: T.into(),
        namespace: NS.into(),
        stream: STREAM.into(),
        group: group.into(),
        shard: 0,
        consumer: "raw".into(),
        max_records,
        max_bytes: 1 << 20,
        wait_ms: 0,
    }
}

fn ack(group: &str, records: Vec<ClaimRef>) -> GroupRequest {
    GroupRequest::Ack {
        tenant: T.into(),
        namespace: NS.into(),
        stream: STREAM.into(),
        group: group.into(),
        shard: 0,
        consumer: "raw".into(),
        records,
    }
}

fn extend(group: &str, records: Vec<ClaimRef>) -> GroupRequest {
    GroupRequest::Extend {
        tenant: T.into(),
        namespace: NS.into(),
        stream: STREAM.into(),
        group: group.into(),
        shard: 0,
        consumer: "raw".into(),
        records,
        visibility_ms: Some(120_000),
    }
}

/// A poll's claims and the payloads of the claimed records, in offset order.
fn claimed(response: Response, body: &Bytes) -> (Vec<ClaimedMeta>, Vec<Bytes>) {
    let Response::Group(GroupResponse::Claimed { shard: 0, records }) = response else {
        panic!("a poll answers claimed records of shard 0, got {response:?}");
    };
    let mut payloads = Vec::new();
    for item in BatchIter::new(body, usize::MAX) {
        let (header, batch) = item.expect("a batch");
        let decoded =
            DecodedBatch::decode_shared_validated(&body.slice_ref(batch), header, usize::MAX)
                .expect("decode");
        for r in decoded.records {
            if records.iter().any(|m| m.offset == r.offset as u64) {
                payloads.push(r.value.unwrap_or_default());
            }
        }
    }
    (records, payloads)
}

fn refs(claims: &[ClaimedMeta]) -> Vec<ClaimRef> {
    claims
        .iter()
        .map(|m| ClaimRef {
            offset: m.offset,
            attempt: m.attempt,
        })
        .collect()
}

/// `(acked, in flight)` of the group on shard 0.
async fn progress(client: &Client, group: &str) -> (u64, u64) {
    let info = client
        .describe_group(T, NS, STREAM, group)
        .await
        .expect("describe");
    let s = &info.shards[0];
    (s.acked, s.in_flight)
}

pub(super) async fn binary_group_headers_answer_like_json_and_a_malformed_one_changes_nothing(
    broker: &Broker,
    conn: &Connection,
    client: &Client,
) {
    conn.create_stream(
        T,
        NS,
        STREAM,
        felix_client::StreamConfig {
            durable: Some(true),
            shards: Some(1),
            ..Default::default()
        },
    )
    .await
    .expect("create stream");
    let messages: Vec<Message> = (0..10)
        .map(|i| Message::new(Bytes::from(format!("r-{i}"))))
        .collect();
    client
        .publish_batch(T, NS, STREAM, messages, AckMode::Batch)
        .await
        .expect("publish");
    // Twin groups: one served in JSON, one in binary, each asked the same.
    for group in ["json", "bin"] {
        client
            .create_group(T, NS, STREAM, group, super::groups::config(60_000, 5, None))
            .await
            .expect("create group");
    }
    let raw = RawConnection::connect(broker.quic_addr).await;
    let agreed = raw.hello_as(broker.admin_token(), features::ALL).await;
    assert_ne!(
        agreed & features::BINARY_GROUP_HEADERS,
        0,
        "the broker offers binary group headers"
    );

    let (is_bin, response, body) = exchange(&raw, json(&poll("json", 10))).await;
    assert!(!is_bin, "a JSON poll is answered in JSON");
    let (json_claims, json_payloads) = claimed(response, &body);
    let (is_bin, response, body) = exchange(&raw, bin(&poll("bin", 10))).await;
    assert!(is_bin, "a binary poll is answered in binary");
    let (bin_claims, bin_payloads) = claimed(response, &body);
    assert_eq!(json_claims.len(), 10);
    assert_eq!(
        refs(&bin_claims),
        refs(&json_claims),
        "same offsets and attempts"
    );
    assert_eq!(bin_payloads, json_payloads, "same records");
    assert!(bin_claims.iter().all(|m| m.deadline_ms > 0));

    // Malformed binary answers, each of which would otherwise have acknowledged all ten:
    // one byte too many, cut short, an unknown operation, a run of no records.
    let good = bin(&ack("bin", refs(&bin_claims)));
    let mut long = good.clone();
    long.push(0);
    let cut = good[..good.len() - 5].to_vec();
    let mut op = good.clone();
    op[1] = 42;
    let mut empty_run = good.clone();
    let count_at = good.len() - 8;
    empty_run[count_at..count_at + 4].copy_from_slice(&0u32.to_be_bytes());
    for (header, why) in [
        (long, "after the last field"),
        (cut, "cut short"),
        (op, "unknown operation 42"),
        (empty_run, "no records"),
    ] {
        match exchange(&raw, header).await {
            (false, Response::Error(e), _)
                if e.code == codes::BAD_REQUEST
                    && e.reason == "malformed_request"
                    && e.message.contains(why) => {}
            other => panic!("a malformed binary header ({why}) is refused, got {other:?}"),
        }
    }
    assert_eq!(
        progress(client, "bin").await,
        (0, 10),
        "a malformed answer changed nothing: all ten still claimed, none acknowledged"
    );

    // Extend the first three, then acknowledge all ten, in each encoding.
    let three = refs(&json_claims[..3]);
    let (is_bin, json_extended, _) = exchange(&raw, json(&extend("json", three.clone()))).await;
    assert!(!is_bin);
    let (is_bin, bin_extended, _) = exchange(&raw, bin(&extend("bin", three))).await;
    assert!(is_bin, "a binary extend is answered in binary");
    for extended in [&json_extended, &bin_extended] {
        match extended {
            Response::Group(GroupResponse::Answered {
                shard: 0,
                deadlines_ms,
            }) => assert_eq!(deadlines_ms.len(), 3, "a deadline per record"),
            other => panic!("an extend is answered with the deadlines, got {other:?}"),
        }
    }
    let (is_bin, json_acked, _) = exchange(&raw, json(&ack("json", refs(&json_claims)))).await;
    assert!(!is_bin);
    let (is_bin, bin_acked, _) = exchange(&raw, good).await;
    assert!(is_bin, "a binary ack is answered in binary");
    assert_eq!(bin_acked, json_acked);
    assert_eq!(progress(client, "json").await, (10, 0));
    assert_eq!(progress(client, "bin").await, (10, 0));
    // An ack sent again (after an unknown outcome) is answered ok again in both encodings;
    // one to a group that does not exist is refused alike, the binary one in JSON.
    let again = vec![refs(&json_claims)[0]];
    let (_, json_again, _) = exchange(&raw, json(&ack("json", again.clone()))).await;
    let (is_bin, bin_again, _) = exchange(&raw, bin(&ack("bin", again.clone()))).await;
    assert!(is_bin);
    assert_eq!(bin_again, json_again);
    // An extend of a record already acknowledged is refused (no claim is left to extend),
    // in both encodings, and the group is as it was.
    for (group, frame) in [
        ("json", json(&extend("json", again.clone()))),
        ("bin", bin(&extend("bin", again.clone()))),
    ] {
        match exchange(&raw, frame).await.1 {
            Response::Error(e) if e.reason == "not_claimed_by_you" => {}
            other => panic!("an extend of an acknowledged record is refused, got {other:?}"),
        }
        assert_eq!(progress(client, group).await, (10, 0));
    }
    let (_, json_refused, _) = exchange(&raw, json(&ack("nope", again.clone()))).await;
    let (is_bin, bin_refused, _) = exchange(&raw, bin(&ack("nope", again))).await;
    assert!(!is_bin, "a refusal of a binary request is JSON");
    match (&json_refused, &bin_refused) {
        (Response::Error(j), Response::Error(b)) => {
            assert_eq!(j.reason, "unknown_group");
            assert_eq!((j.code, &j.reason), (b.code, &b.reason));
        }
        other => panic!("an ack to no group is refused in both encodings, got {other:?}"),
    }

    // A client whose broker did not agree (as an older broker would not) sends JSON and
    // consumes as before; this client, which agreed, does so in binary.
    let config = ClientConfig {
        token: broker.admin_token(),
        features: features::ALL & !features::BINARY_GROUP_HEADERS,
        ..ClientConfig::default()
    };
    let old_conn = Connection::connect(&broker.quic_addr.to_string(), config.clone())
        .await
        .expect("connect");
    assert!(!old_conn.has_feature(features::BINARY_GROUP_HEADERS));
    assert!(conn.has_feature(features::BINARY_GROUP_HEADERS));
    let old = Client::connect([broker.quic_addr.to_string()], config)
        .await
        .expect("connect");
    let late: Vec<Message> = ["late-0", "late-1"]
        .into_iter()
        .map(|p| Message::new(Bytes::from_static(p.as_bytes())))
        .collect();
    client
        .publish_batch(T, NS, STREAM, late, AckMode::Batch)
        .await
        .expect("publish");
    for (c, want) in [(&old, "late-0"), (client, "late-1")] {
        let mut consumer = c.group(T, NS, STREAM, "json");
        let got = consumer
            .poll(1, Duration::from_millis(500))
            .await
            .expect("poll");
        assert_eq!(got.len(), 1);
        assert_eq!(&got[0].payload[..], want.as_bytes());
        got[0].ack().await.expect("ack");
    }
    assert_eq!(progress(client, "json").await, (12, 0));
}
