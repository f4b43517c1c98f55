//! ApiVersions advertises exactly what the Kafka listener serves (docs/kafka.md, "APIs"):
//! the set a client reads from ApiVersions v3 on a real broker is compared with the set the
//! broker answers. Every advertised API, at its lowest and its highest version, gets an
//! answer to a minimal request that `kafka-protocol` decodes as that API's response (an
//! advertised API with no handler would close the connection instead); a version just
//! outside an advertised range, and every API that is not advertised, is refused without an
//! answer (so nothing is served that a client was not told about).
//!
//! A step of `broker::kafka::a_too_new_api_versions_gets_the_v0_answer_and_bad_requests_close_only_their_connection`,
//! which already runs a broker for raw ApiVersions requests.

use std::net::SocketAddr;

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::common::PATIENCE;

/// Kafka's API keys go up to here today; every key below it that `kafka-protocol` knows is
/// asked for.
const HIGHEST_KEY: i16 = 100;

/// A request frame (length prefix, header, body) for `key` at `version`: the API's default
/// request, changed only where the default would get no answer (acks=0 produce). Without
/// `body` only the header goes out: enough for a request the broker must refuse unread, at
/// versions `kafka-protocol` may not encode.
fn request_frame(key: ApiKey, version: i16, correlation: i32, body: bool) -> Vec<u8> {
    let mut buf = BytesMut::new();
    RequestHeader::default()
        .with_request_api_key(key as i16)
        .with_request_api_version(version)
        .with_correlation_id(correlation)
        .with_client_id(Some(kafka_protocol::protocol::StrBytes::from_static_str(
            "advertised",
        )))
        .encode(&mut buf, key.request_header_version(version))
        .expect("header");
    macro_rules! body {
        ($t:ty) => {
            <$t>::default().encode(&mut buf, version)
        };
    }
    let encoded = match key {
        _ if !body => Ok(()),
        ApiKey::Produce => ProduceRequest::default()
            .with_acks(-1)
            .with_timeout_ms(1000)
            .encode(&mut buf, version),
        ApiKey::Fetch => body!(FetchRequest),
        ApiKey::ListOffsets => body!(ListOffsetsRequest),
        ApiKey::Metadata => body!(MetadataRequest),
        ApiKey::OffsetCommit => body!(OffsetCommitRequest),
        ApiKey::OffsetFetch => body!(OffsetFetchRequest),
        ApiKey::FindCoordinator => body!(FindCoordinatorRequest),
        ApiKey::JoinGroup => body!(JoinGroupRequest),
        ApiKey::Heartbeat => body!(HeartbeatRequest),
        ApiKey::LeaveGroup => body!(LeaveGroupRequest),
        ApiKey::SyncGroup => body!(SyncGroupRequest),
        ApiKey::DescribeGroups => body!(DescribeGroupsRequest),
        ApiKey::ListGroups => body!(ListGroupsRequest),
        ApiKey::SaslHandshake => body!(SaslHandshakeRequest),
        ApiKey::ApiVersions => body!(ApiVersionsRequest),
        ApiKey::CreateTopics => body!(CreateTopicsRequest),
        ApiKey::DeleteTopics => body!(DeleteTopicsRequest),
        ApiKey::DeleteRecords => body!(DeleteRecordsRequest),
        ApiKey::InitProducerId => body!(InitProducerIdRequest),
        ApiKey::DescribeConfigs => body!(DescribeConfigsRequest),
        ApiKey::AlterConfigs => body!(AlterConfigsRequest),
        ApiKey::SaslAuthenticate => body!(SaslAuthenticateRequest),
        ApiKey::CreatePartitions => body!(CreatePartitionsRequest),
        ApiKey::DeleteGroups => body!(DeleteGroupsRequest),
        ApiKey::DescribeTopicPartitions => body!(DescribeTopicPartitionsRequest),
        ApiKey::DescribeProducers => body!(DescribeProducersRequest),
        ApiKey::IncrementalAlterConfigs => body!(IncrementalAlterConfigsRequest),
        ApiKey::ConsumerGroupHeartbeat => body!(ConsumerGroupHeartbeatRequest),
        ApiKey::ShareGroupHeartbeat => body!(ShareGroupHeartbeatRequest),
        ApiKey::ShareGroupDescribe => body!(ShareGroupDescribeRequest),
        ApiKey::ShareFetch => body!(ShareFetchRequest),
        ApiKey::ShareAcknowledge => body!(ShareAcknowledgeRequest),
        ApiKey::DescribeShareGroupOffsets => body!(DescribeShareGroupOffsetsRequest),
        ApiKey::AlterShareGroupOffsets => body!(AlterShareGroupOffsetsRequest),
        ApiKey::DeleteShareGroupOffsets => body!(DeleteShareGroupOffsetsRequest),
        other => panic!("{other:?} is advertised: add its request here"),
    };
    encoded.unwrap_or_else(|e| panic!("encode {key:?} v{version}: {e}"));
    let mut frame = (buf.len() as u32).to_be_bytes().to_vec();
    frame.extend_from_slice(&buf);
    frame
}

/// Whether `body` (after the response header) decodes as `key`'s response at `version`.
fn decodes_as(key: ApiKey, version: i16, mut body: Bytes) -> Result<(), String> {
    macro_rules! response {
        ($t:ty) => {{
            ResponseHeader::decode(&mut body, <$t>::header_version(version))
                .map_err(|e| format!("header: {e}"))?;
            <$t>::decode(&mut body, version)
                .map(|_| ())
                .map_err(|e| e.to_string())
        }};
    }
    match key {
        ApiKey::Produce => response!(ProduceResponse),
        ApiKey::Fetch => response!(FetchResponse),
        ApiKey::ListOffsets => response!(ListOffsetsResponse),
        ApiKey::Metadata => response!(MetadataResponse),
        ApiKey::OffsetCommit => response!(OffsetCommitResponse),
        ApiKey::OffsetFetch => response!(OffsetFetchResponse),
        ApiKey::FindCoordinator => response!(FindCoordinatorResponse),
        ApiKey::JoinGroup => response!(JoinGroupResponse),
        ApiKey::Heartbeat => response!(HeartbeatResponse),
        ApiKey::LeaveGroup => response!(LeaveGroupResponse),
        ApiKey::SyncGroup => response!(SyncGroupResponse),
        ApiKey::DescribeGroups => response!(DescribeGroupsResponse),
        ApiKey::ListGroups => response!(ListGroupsResponse),
        ApiKey::SaslHandshake => response!(SaslHandshakeResponse),
        ApiKey::ApiVersions => response!(ApiVersionsResponse),
        ApiKey::CreateTopics => response!(CreateTopicsResponse),
        ApiKey::DeleteTopics => response!(DeleteTopicsResponse),
        ApiKey::DeleteRecords => response!(DeleteRecordsResponse),
        ApiKey::InitProducerId => response!(InitProducerIdResponse),
        ApiKey::DescribeConfigs => response!(DescribeConfigsResponse),
        ApiKey::AlterConfigs => response!(AlterConfigsResponse),
        ApiKey::SaslAuthenticate => response!(SaslAuthenticateResponse),
        ApiKey::CreatePartitions => response!(CreatePartitionsResponse),
        ApiKey::DeleteGroups => response!(DeleteGroupsResponse),
        ApiKey::DescribeTopicPartitions => response!(DescribeTopicPartitionsResponse),
        ApiKey::DescribeProducers => response!(DescribeProducersResponse),
        ApiKey::IncrementalAlterConfigs => response!(IncrementalAlterConfigsResponse),
        ApiKey::ConsumerGroupHeartbeat => response!(ConsumerGroupHeartbeatResponse),
        ApiKey::ShareGroupHeartbeat => response!(ShareGroupHeartbeatResponse),
        ApiKey::ShareGroupDescribe => response!(ShareGroupDescribeResponse),
        ApiKey::ShareFetch => response!(ShareFetchResponse),
        ApiKey::ShareAcknowledge => response!(ShareAcknowledgeResponse),
        ApiKey::DescribeShareGroupOffsets => response!(DescribeShareGroupOffsetsResponse),
        ApiKey::AlterShareGroupOffsets => response!(AlterShareGroupOffsetsResponse),
        ApiKey::DeleteShareGroupOffsets => response!(DeleteShareGroupOffsetsResponse),
        other => Err(format!(
            "{other:?} is advertised but this test cannot decode its answer: add it here"
        )),
    }
}

/// Sends one request (with a body or only its header) on a new connection: its answer's
/// body, or `None` when the broker closed the connection without one.
async fn ask(addr: SocketAddr, key: ApiKey, version: i16, body: bool) -> Option<Bytes> {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    s.write_all(&request_frame(key, version, 77, body))
        .await
        .expect("write");
    let mut len = [0u8; 4];
    let read = tokio::time::timeout(PATIENCE, s.read_exact(&mut len))
        .await
        .unwrap_or_else(|_| panic!("{key:?} v{version}: neither answered nor closed"));
    read.ok()?;
    let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
    s.read_exact(&mut body).await.expect("response body");
    Some(Bytes::from(body))
}

/// The step: the advertised set is the answered set.
pub(super) async fn every_advertised_api_is_answered_and_nothing_else(addr: SocketAddr) {
    // What a client reads: ApiVersions v3.
    let mut body = ask(addr, ApiKey::ApiVersions, 3, true)
        .await
        .expect("ApiVersions v3 answered");
    ResponseHeader::decode(&mut body, ApiVersionsResponse::header_version(3)).expect("header");
    let versions = ApiVersionsResponse::decode(&mut body, 3).expect("ApiVersions v3");
    assert_eq!(versions.error_code, 0);
    let advertised: Vec<(ApiKey, i16, i16)> = versions
        .api_keys
        .iter()
        .map(|a| {
            let key = ApiKey::try_from(a.api_key)
                .unwrap_or_else(|_| panic!("advertised key {} is not a Kafka API", a.api_key));
            (key, a.min_version, a.max_version)
        })
        .collect();
    assert!(advertised.len() > 20, "{advertised:?}");

    let mut unanswered = Vec::new();
    for &(key, min, max) in &advertised {
        for version in [min, max] {
            match ask(addr, key, version, true).await {
                None => unanswered.push(format!("{key:?} v{version}: connection closed")),
                Some(answer) => {
                    let correlation = i32::from_be_bytes(answer[0..4].try_into().unwrap());
                    assert_eq!(correlation, 77, "{key:?} v{version}");
                    if let Err(e) = decodes_as(key, version, answer) {
                        unanswered.push(format!("{key:?} v{version}: {e}"));
                    }
                }
            }
        }
        // Just outside the advertised range: refused unread.
        let outside = [(min > 0).then(|| min - 1), Some(max + 1)];
        for version in outside.into_iter().flatten() {
            if key == ApiKey::ApiVersions {
                continue; // A too-new ApiVersions gets the v0 answer (the step before).
            }
            assert!(
                ask(addr, key, version, false).await.is_none(),
                "{key:?} v{version} is outside the advertised {min}..={max} but was answered"
            );
        }
    }
    assert!(
        unanswered.is_empty(),
        "advertised but not served: {unanswered:#?}"
    );

    // Every Kafka API that is not advertised is refused without an answer.
    for raw in 0..=HIGHEST_KEY {
        let Ok(key) = ApiKey::try_from(raw) else {
            continue;
        };
        if advertised.iter().any(|a| a.0 == key) {
            continue;
        }
        let min = key.valid_versions().min.max(0);
        assert!(
            ask(addr, key, min, false).await.is_none(),
            "{key:?} is answered but not advertised"
        );
    }
}
