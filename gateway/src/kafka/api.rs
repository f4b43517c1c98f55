//! Which Kafka APIs this listener speaks, at which versions, and how a request frame becomes
//! a typed request and a typed response becomes a frame. No I/O.
//!
//! The invariant: ApiVersions advertises exactly [`SUPPORTED_APIS`], and a request for any
//! other API or version is never decoded (an ApiVersions request newer than ours is answered
//! in the v0 shape with `UNSUPPORTED_VERSION`, as Kafka does, so an older or newer client
//! falls back; anything else closes the connection).

use bytes::{Buf, Bytes, BytesMut};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::{ApiKey, ApiVersionsResponse, RequestHeader, ResponseHeader};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion};

/// Every API served, with its lowest and highest version.
pub const SUPPORTED_APIS: &[(ApiKey, i16, i16)] = &[
    (ApiKey::Produce, 3, 9),
    (ApiKey::Fetch, 4, 12),
    (ApiKey::ListOffsets, 1, 7),
    (ApiKey::Metadata, 0, 12),
    (ApiKey::OffsetCommit, 2, 8),
    (ApiKey::OffsetFetch, 1, 7),
    (ApiKey::FindCoordinator, 0, 4),
    (ApiKey::JoinGroup, 0, 7),
    (ApiKey::Heartbeat, 0, 4),
    (ApiKey::LeaveGroup, 0, 4),
    (ApiKey::SyncGroup, 0, 5),
    (ApiKey::DescribeGroups, 0, 5),
    (ApiKey::ListGroups, 0, 4),
    (ApiKey::ApiVersions, 0, 3),
    (ApiKey::CreateTopics, 2, 7),
    (ApiKey::DeleteTopics, 1, 6),
    (ApiKey::InitProducerId, 0, 4),
    (ApiKey::DescribeConfigs, 1, 4),
    (ApiKey::AlterConfigs, 0, 2),
    (ApiKey::IncrementalAlterConfigs, 0, 1),
    (ApiKey::CreatePartitions, 0, 3),
    (ApiKey::DeleteRecords, 0, 2),
    (ApiKey::DeleteGroups, 0, 2),
    (ApiKey::DescribeTopicPartitions, 0, 0),
    (ApiKey::DescribeProducers, 0, 0),
    // v0 too: librdkafka 2.0 asks for it before it uses PLAIN (the bare SASL frame that
    // follows a v0 handshake is handled in `sasl`).
    (ApiKey::SaslHandshake, 0, 1),
    (ApiKey::SaslAuthenticate, 0, 2),
    // Advertised only to be refused with a message (see `unbuilt`).
    (ApiKey::ConsumerGroupHeartbeat, 0, 1),
    // Share groups (KIP-932, see `share`): the versions librdkafka 2.16 sends.
    (ApiKey::ShareGroupHeartbeat, 1, 1),
    (ApiKey::ShareGroupDescribe, 1, 1),
    (ApiKey::ShareFetch, 1, 1),
    (ApiKey::ShareAcknowledge, 1, 1),
    (ApiKey::DescribeShareGroupOffsets, 0, 0),
    (ApiKey::AlterShareGroupOffsets, 0, 0),
    (ApiKey::DeleteShareGroupOffsets, 0, 0),
];

/// The versions of `key` this listener serves, if any.
pub fn supported(key: ApiKey) -> Option<(i16, i16)> {
    SUPPORTED_APIS
        .iter()
        .find(|(k, _, _)| *k == key)
        .map(|(_, min, max)| (*min, *max))
}

/// A request frame's fixed prefix, readable whatever the API and version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prefix {
    pub api_key: i16,
    pub api_version: i16,
    pub correlation_id: i32,
}

/// Why a frame cannot be served; the connection is closed with this reason logged.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RequestError {
    #[error("request of {0} bytes is shorter than a request header")]
    TooShort(usize),
    #[error("unknown API key {0}")]
    UnknownApi(i16),
    #[error("{api:?} version {version} is not supported (supported: {min}..={max})")]
    UnsupportedVersion {
        api: ApiKey,
        version: i16,
        min: i16,
        max: i16,
    },
    #[error("malformed {api:?} v{version} request: {message}")]
    Malformed {
        api: ApiKey,
        version: i16,
        message: String,
    },
}

/// Reads the fixed prefix (key, version, correlation id) of a request frame.
pub fn prefix(frame: &[u8]) -> Result<Prefix, RequestError> {
    if frame.len() < 8 {
        return Err(RequestError::TooShort(frame.len()));
    }
    Ok(Prefix {
        api_key: i16::from_be_bytes([frame[0], frame[1]]),
        api_version: i16::from_be_bytes([frame[2], frame[3]]),
        correlation_id: i32::from_be_bytes([frame[4], frame[5], frame[6], frame[7]]),
    })
}

/// What to do with a request frame before decoding its body.
#[derive(Debug, PartialEq, Eq)]
pub enum Route {
    /// Decode the header and body at this version and serve it.
    Serve { api: ApiKey, version: i16 },
    /// An ApiVersions request newer than ours: answer the v0 shape with
    /// `UNSUPPORTED_VERSION` and the versions we do serve.
    ApiVersionsTooNew,
}

/// Routes a frame by its prefix.
pub fn route(p: &Prefix) -> Result<Route, RequestError> {
    let api = ApiKey::try_from(p.api_key).map_err(|_| RequestError::UnknownApi(p.api_key))?;
    let Some((min, max)) = supported(api) else {
        return Err(RequestError::UnknownApi(p.api_key));
    };
    if p.api_version >= min && p.api_version <= max {
        return Ok(Route::Serve {
            api,
            version: p.api_version,
        });
    }
    if api == ApiKey::ApiVersions && p.api_version > max {
        return Ok(Route::ApiVersionsTooNew);
    }
    Err(RequestError::UnsupportedVersion {
        api,
        version: p.api_version,
        min,
        max,
    })
}

/// Decodes the request header at the header version `api` uses at `version`, leaving
/// `frame` at the start of the body.
pub fn decode_header(
    frame: &mut Bytes,
    api: ApiKey,
    version: i16,
) -> Result<RequestHeader, RequestError> {
    let header_version = api.request_header_version(version);
    guarded(|| RequestHeader::decode(frame, header_version)).map_err(|message| {
        RequestError::Malformed {
            api,
            version,
            message: format!("header: {message}"),
        }
    })
}

/// Decodes a request body. Bytes after its end are ignored, as Kafka ignores them
/// (librdkafka 2.16 sends three after a Metadata v12 request).
pub fn decode_body<R: Decodable>(
    frame: &mut Bytes,
    api: ApiKey,
    version: i16,
) -> Result<R, RequestError> {
    let request =
        guarded(|| R::decode(frame, version)).map_err(|message| RequestError::Malformed {
            api,
            version,
            message,
        })?;
    if frame.has_remaining() {
        tracing::debug!(
            api = ?api,
            version,
            extra = frame.remaining(),
            "ignoring bytes after the end of a request"
        );
    }
    Ok(request)
}

/// Runs a decoder, turning an error or a panic into a message: bytes from the network
/// must never take a connection task down unexplained.
fn guarded<T>(decode: impl FnOnce() -> anyhow::Result<T>) -> Result<T, String> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(decode)) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(format!("{e:#}")),
        Err(_) => Err("the decoder panicked".to_owned()),
    }
}

/// Room for a response header (a correlation id and, in flexible versions, its tags).
const HEADER_ROOM: usize = 16;

/// A response frame: the length prefix, the response header and the body.
pub fn encode_response<R: Encodable + HeaderVersion>(
    correlation_id: i32,
    version: i16,
    response: &R,
) -> anyhow::Result<Bytes> {
    // Sized up front: a fetch's answer carries up to megabytes of records, which a buffer
    // grown from a few hundred bytes would copy again at every doubling.
    let body = response.compute_size(version).unwrap_or(0);
    let mut buf = BytesMut::with_capacity(4 + HEADER_ROOM + body);
    buf.extend_from_slice(&[0; 4]);
    ResponseHeader::default()
        .with_correlation_id(correlation_id)
        .encode(&mut buf, R::header_version(version))?;
    response.encode(&mut buf, version)?;
    let len = u32::try_from(buf.len() - 4)?;
    buf[..4].copy_from_slice(&len.to_be_bytes());
    Ok(buf.freeze())
}

/// The ApiVersions answer: every supported API, or `error` (UNSUPPORTED_VERSION) with the
/// same list when the client asked in a version we do not know.
pub fn api_versions(error: Option<ResponseError>) -> ApiVersionsResponse {
    let api_keys = SUPPORTED_APIS
        .iter()
        .map(|(key, min, max)| {
            ApiVersion::default()
                .with_api_key(*key as i16)
                .with_min_version(*min)
                .with_max_version(*max)
        })
        .collect();
    ApiVersionsResponse::default()
        .with_error_code(error.map_or(0, |e| e.code()))
        .with_api_keys(api_keys)
        .with_finalized_features_epoch(-1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::MetadataRequest;
    use proptest::prelude::*;

    fn frame(key: i16, version: i16, correlation: i32, body: &[u8]) -> Vec<u8> {
        let mut f = Vec::new();
        f.extend_from_slice(&key.to_be_bytes());
        f.extend_from_slice(&version.to_be_bytes());
        f.extend_from_slice(&correlation.to_be_bytes());
        f.extend_from_slice(body);
        f
    }

    /// Decodes a frame the way a connection does; any error is fine, a panic is not.
    fn serve_or_refuse(bytes: &[u8]) -> Result<(), RequestError> {
        let p = prefix(bytes)?;
        let Route::Serve { api, version } = route(&p)? else {
            return Ok(());
        };
        let mut buf = Bytes::copy_from_slice(bytes);
        decode_header(&mut buf, api, version)?;
        use kafka_protocol::messages::*;
        macro_rules! body {
            ($t:ty) => {
                decode_body::<$t>(&mut buf, api, version).map(|_| ())
            };
        }
        match api {
            ApiKey::Produce => body!(ProduceRequest),
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
            ApiKey::ApiVersions => body!(ApiVersionsRequest),
            ApiKey::CreateTopics => body!(CreateTopicsRequest),
            ApiKey::DeleteTopics => body!(DeleteTopicsRequest),
            ApiKey::InitProducerId => body!(InitProducerIdRequest),
            ApiKey::DescribeConfigs => body!(DescribeConfigsRequest),
            ApiKey::AlterConfigs => body!(AlterConfigsRequest),
            ApiKey::IncrementalAlterConfigs => body!(IncrementalAlterConfigsRequest),
            ApiKey::CreatePartitions => body!(CreatePartitionsRequest),
            ApiKey::DeleteRecords => body!(DeleteRecordsRequest),
            ApiKey::DeleteGroups => body!(DeleteGroupsRequest),
            ApiKey::DescribeTopicPartitions => body!(DescribeTopicPartitionsRequest),
            ApiKey::DescribeProducers => body!(DescribeProducersRequest),
            ApiKey::ConsumerGroupHeartbeat => body!(ConsumerGroupHeartbeatRequest),
            ApiKey::ShareGroupHeartbeat => body!(ShareGroupHeartbeatRequest),
            ApiKey::ShareGroupDescribe => body!(ShareGroupDescribeRequest),
            ApiKey::ShareFetch => body!(ShareFetchRequest),
            ApiKey::ShareAcknowledge => body!(ShareAcknowledgeRequest),
            ApiKey::DescribeShareGroupOffsets => body!(DescribeShareGroupOffsetsRequest),
            ApiKey::AlterShareGroupOffsets => body!(AlterShareGroupOffsetsRequest),
            ApiKey::DeleteShareGroupOffsets => body!(DeleteShareGroupOffsetsRequest),
            _ => Ok(()),
        }
    }

    #[test]
    fn an_api_versions_request_newer_than_ours_gets_the_v0_answer() {
        let p = prefix(&frame(18, 4, 7, &[])).expect("prefix");
        assert_eq!(route(&p), Ok(Route::ApiVersionsTooNew));
        let response = api_versions(Some(ResponseError::UnsupportedVersion));
        let bytes = encode_response(7, 0, &response).expect("encode");
        // length, correlation id 7, error 35, then the array of APIs.
        assert_eq!(&bytes[4..8], &7i32.to_be_bytes());
        assert_eq!(&bytes[8..10], &35i16.to_be_bytes());
        let count = i32::from_be_bytes([bytes[10], bytes[11], bytes[12], bytes[13]]);
        assert_eq!(count as usize, SUPPORTED_APIS.len());
        assert_eq!(bytes.len(), 14 + 6 * SUPPORTED_APIS.len());
    }

    #[test]
    fn unknown_apis_and_versions_are_refused_before_decoding() {
        let p = prefix(&frame(0, 2, 1, &[])).expect("prefix");
        assert!(matches!(
            route(&p),
            Err(RequestError::UnsupportedVersion { .. })
        ));
        let p = prefix(&frame(24, 0, 1, &[])).expect("prefix");
        assert_eq!(route(&p), Err(RequestError::UnknownApi(24)));
        let p = prefix(&frame(-5, 0, 1, &[])).expect("prefix");
        assert_eq!(route(&p), Err(RequestError::UnknownApi(-5)));
        assert_eq!(prefix(&[0, 3, 0]), Err(RequestError::TooShort(3)));
    }

    #[test]
    fn a_huge_array_count_is_refused_not_allocated() {
        // Metadata v0: header (client id null), then a topic count of 0x033c0c00.
        let mut body = vec![0xff, 0xff];
        body.extend_from_slice(&0x033c_0c00i32.to_be_bytes());
        let bytes = frame(3, 0, 1, &body);
        let err = serve_or_refuse(&bytes).expect_err("refused");
        assert!(matches!(err, RequestError::Malformed { .. }), "{err}");
        // The same for a flexible version's compact array (varint count).
        let mut body = vec![0xff, 0xff, 0x00];
        body.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 0x0f]);
        let bytes = frame(3, 12, 1, &body);
        assert!(serve_or_refuse(&bytes).is_err());
    }

    #[test]
    fn bytes_after_a_request_are_ignored_as_kafka_does() {
        // librdkafka 2.16's Metadata v12 for every topic, three bytes longer than the schema.
        let mut buf = Bytes::from(frame(
            3,
            12,
            3,
            &[
                0, 7, b'r', b'd', b'k', b'a', b'f', b'k', b'a', 0, 0, 0, 0, 0, 1, 0, 0,
            ],
        ));
        decode_header(&mut buf, ApiKey::Metadata, 12).expect("header");
        let r = decode_body::<MetadataRequest>(&mut buf, ApiKey::Metadata, 12).expect("decoded");
        assert!(r.topics.is_none(), "every topic");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4000))]

        /// The request decoder's fuzz test: random bodies behind every supported API and
        /// version are answered with an error or decoded, never a panic or an abort.
        #[test]
        fn random_requests_never_panic(
            api in 0usize..SUPPORTED_APIS.len(),
            version_offset in 0i16..16,
            body in proptest::collection::vec(any::<u8>(), 0..256),
        ) {
            let (key, min, max) = SUPPORTED_APIS[api];
            let version = min + version_offset % (max - min + 1);
            let bytes = frame(key as i16, version, 1, &body);
            let _ = serve_or_refuse(&bytes);
        }

        /// Bodies that start like real ones (a null client id, then counts and lengths of
        /// all sizes) reach deeper into the decoders.
        #[test]
        fn random_counts_never_panic(
            api in 0usize..SUPPORTED_APIS.len(),
            version_offset in 0i16..16,
            words in proptest::collection::vec(any::<i32>(), 0..24),
        ) {
            let (key, min, max) = SUPPORTED_APIS[api];
            let version = min + version_offset % (max - min + 1);
            let mut body = vec![0xff, 0xff];
            for w in words {
                body.extend_from_slice(&w.to_be_bytes());
            }
            let _ = serve_or_refuse(&frame(key as i16, version, 1, &body));
        }
    }
}
